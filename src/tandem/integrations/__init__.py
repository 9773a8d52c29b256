"""Optional integrations with other frameworks; each imports its framework only when used."""
