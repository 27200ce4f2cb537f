"""dlts_lustre: the typed wrapper over Lustre's ``lfs`` and ``lctl`` used by DLTS.

Owns everything DLTS does to a Lustre filesystem: running the two tools (``runner``), parsing what
they print (``parsers``), typed operations (``client``), the declarative policy and its idempotent
``apply`` (``policy``, ``plan``), the ``dlts-lustre`` command line (``cli``) and the Prometheus
collector the node agent registers (``metrics``).
"""
