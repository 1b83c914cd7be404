"""The dashboard: server-rendered pages (Jinja2, autoescaped) with htmx, served by ``orl serve`` beside the API."""
