"""1Panel: app-store export, the validator's rules, and the HTTP API client."""
