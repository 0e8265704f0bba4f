#!/bin/sh
# Test worker for --no-python launches: report the launcher's env and args.
echo "RANK=$RANK LOCAL_RANK=$LOCAL_RANK WORLD_SIZE=$WORLD_SIZE args=$*"
exit 0
