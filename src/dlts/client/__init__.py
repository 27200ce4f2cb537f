"""The user CLI's side: a small HTTP client of the REST API (``http``), the profiles ``dlts login``
stores (``profiles``), human output (``output``) and the user commands (``commands``). It needs no
database and no server configuration: it works from a laptop with a URL and a token."""
