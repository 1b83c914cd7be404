"""What the API (``api/``) and the dashboard (``web/``) share, below both: the upload path every file takes and the
hook a request that wrote calls."""
