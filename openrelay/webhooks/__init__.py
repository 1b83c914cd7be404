"""Webhooks: signed events sent to an organization's endpoints from the store's outbox (``store/webhook_outbox.py``).

``signing`` makes secrets and Standard Webhooks headers, ``network`` decides which URLs and addresses a delivery
may reach, ``delivery`` is the loop each worker process runs to send what is due.
"""
