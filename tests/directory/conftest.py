from tests.slapd_server import slapd  # noqa: F401  (the fixture)
