"""How an env's operator is put together: which operator an env gets (modes), the `up`
service, the `operator` command and the ledger of applied plans."""
