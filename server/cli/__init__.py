"""`laggard`, the collector's command line: `main` (server/cli/main.py) builds the parser from
the domains' commands and runs one."""
