"""The job across nodes: the cluster view and job-wide dumps."""
