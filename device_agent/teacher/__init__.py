"""Labels from a teacher model, on the board (``job.json``'s ``teacher`` is
:mod:`device_agent.teacher_spec`, a wire type): class labels (``labels``) and a detector teacher's
boxes (``boxes``).
"""
