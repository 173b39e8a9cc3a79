"""Simulated worker hosts on this machine (``odl hosts up | down | status | sync``), issue 45.

Each host ``hN`` is a network namespace of its own (a veth pair to this machine, as a virtual
board's: :func:`tasks.vboard.sshd.make_netns`, else this machine's network, said once), its own
``ODL_HOME`` (``$ODL_HOME/hosts/hN`` of the first home, which it alone uses) and a Prefect process
worker on the pool ``odl-pool`` talking to the first home's Prefect server over that link, under
an optional CPU quota (a cgroup: :mod:`tasks.vboard.cgroup`). :mod:`tasks.hosts.lifecycle` starts
and stops them; :mod:`tasks.hosts.share` gives a host the boards it drives (inventory entries,
keys, pinned host keys, copied into its own home until the shared store holds them);
:mod:`tasks.hosts.catchup` brings a host's copies up to date with the shared store, as the host,
before its worker starts (a new host, or one back after its processes died). Every failure is a
:class:`tasks.stack.StackError`.
"""
