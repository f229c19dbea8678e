"""The `pipesgd` commands: train, compare (and its staleness study), predict, bench, and their
MPI twins. cli.py parses the command line and hands each command to its module."""
