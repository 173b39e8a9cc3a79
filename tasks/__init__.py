"""The host side of the pipeline, by concern: ``stages`` (the one stage API both orchestrations
compose), ``recipe``, ``prepare``, ``board`` (inventory, transports, agent, blobs, jobs),
``judge`` (evaluation, registry, report), ``prefect`` (thin task wrappers), ``vboard`` (the
virtual board), and ``errors`` (one error tree, exit codes, retry policy)."""
