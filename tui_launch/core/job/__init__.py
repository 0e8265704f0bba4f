"""The job across nodes, through the store the rendezvous already uses.

- ``view``: the cluster view (``tuilaunch-cluster``): every agent publishes its node's status
  into the job's store and reads the others'.
- ``jobstacks``: job-wide stack dumps: a dump asked for on one node reaches every node, and
  the answers are gathered on the node that asked.
"""
