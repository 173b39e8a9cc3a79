"""Everything that talks to a board: the inventory, the transport seam (``transport/``: SSH or
local, each a context manager), the device agent's install and ``info`` (``agent``), its JSON
commands and the dataset folder's listing (``control``), content-addressed uploads (``blobs``), the
models the board serves (``releases``), jobs on the board (``jobs``), the job training there now and
its orphans (``orphans``), following their events (``follow``), one whole job (``run``) and the
verified download of its outputs (``retrieve``)."""
