"""Binary machinery every binary shares: one-line errors and --help, flag aliases, the shared
flag definitions, and the end of TFF worker_binary children."""
