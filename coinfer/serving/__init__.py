"""Serving plumbing both daemons share, apart from the domain (tasks, rules, extraction, chat, the
wire types) in ``coinfer``: logging, child processes and priorities, event-loop stall watching,
request-byte decoding guards, schema-checked state files, and the settings system."""
