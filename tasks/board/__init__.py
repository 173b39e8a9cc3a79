"""Everything that talks to a board: the inventory, the transport seam (``transport/``: SSH or
local), the device agent's install and ``info`` (``agent``), content-addressed uploads (``blobs``),
jobs on the board (``jobs``), following their events (``follow``), one whole job (``run``) and the
verified download of its outputs (``retrieve``)."""
