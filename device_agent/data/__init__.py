"""The board's data: blobs (``blobstore``), dataset folders that grow (``datasets``,
``dataset_append``), the readers a job trains from (``readers``), the checks before the first step
(``checks``) and frozen-prefix caching (``prefix_cache``; its spec is :mod:`device_agent.prefix_spec`).
"""
