"""The incident store's schema migrations, run by ``Store.open`` through alembic's API (no
alembic.ini). A new one is ``versions/NNNN_what.py``, written from ``script.py.mako`` with
the next number as its revision and explicit ``op`` calls (never schema.py's tables: a
released migration must not change); tests/unit/service/test_store.py checks that the
migrations end at what ``hangdoc/service/schema.py`` declares."""
