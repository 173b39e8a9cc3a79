"""One job on the board (its spec is :mod:`device_agent.jobspec`, a wire type): its folder
(``jobdir``), run (``runner``), training loop (``trainer``, ``schedule``, ``checkpoints``, ``hold``),
events (``events``), state (``jobstate``) and supervision (``supervise``).
"""
