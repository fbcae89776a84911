from tests.journal.pg import pg_server, pg_url

__all__ = ["pg_server", "pg_url"]
