"""Who may do what: bearer tokens with scopes (docs/security.md).

tokens.py: the token format, hashing and the Principal a token stands for (pure).
store.py: tokens in the database (keyword-only functions over a Connection).
guard.py: the FastAPI dependencies that authenticate a request and check its scope.
ratelimit.py: a token bucket per token, answering 429 with Retry-After.
"""
