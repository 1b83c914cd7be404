"""Which webhook URLs and addresses are refused (openrelay/webhooks/network.py), the catalog's [webhooks] allow,
the backoff, and signatures the standardwebhooks package and the OpenAI SDK verify."""

from __future__ import annotations

import ipaddress
import time

import openai
import pytest
from standardwebhooks import Webhook

from openrelay.catalog import parse_catalog
from openrelay.config import Settings, WebhookSettings
from openrelay.errors import CatalogError
from openrelay.webhooks.delivery import retry_backoff
from openrelay.webhooks.network import address_refusal, webhook_url_problem
from openrelay.webhooks.signing import new_secret, signed_headers

ALLOWING = parse_catalog('[webhooks]\nallow = ["http://127.0.0.1:8123/hooks/", "http://10.0.0.7/"]\n')
NOTHING = parse_catalog("")


@pytest.mark.parametrize(("address", "private_allowed", "refused"), [
    ("8.8.8.8", False, None),
    ("2001:4860:4860::8888", False, None),
    ("127.0.0.1", False, "loopback or private"),
    ("127.0.0.1", True, None),
    ("10.0.0.7", False, "loopback or private"),
    ("172.16.5.4", False, "loopback or private"),
    ("100.64.0.1", False, "loopback or private"),  # shared address space (carrier-grade NAT)
    ("::1", False, "loopback or private"),
    ("fc00::1", False, "loopback or private"),
    ("::ffff:127.0.0.1", False, "loopback or private"),  # IPv4-mapped
    ("64:ff9b::a00:7", False, "loopback or private"),  # NAT64 of 10.0.0.7
    ("2002:a00:7::", False, "loopback or private"),  # 6to4 of 10.0.0.7
    ("169.254.169.254", True, "link-local or metadata"),  # never, whatever the allow-list says
    ("169.254.1.1", True, "link-local or metadata"),
    ("fe80::1", True, "link-local or metadata"),
    ("::ffff:169.254.169.254", True, "link-local or metadata"),
    ("fd00:ec2::254", True, "link-local or metadata"),
    ("100.100.100.200", True, "link-local or metadata"),
    ("168.63.129.16", True, "link-local or metadata"),
    ("::127.0.0.1", True, "no delivery can reach"),  # IPv4-compatible IPv6: never routed
    ("::", True, "no delivery can reach"),
    ("0.0.0.0", True, "no delivery can reach"),
    ("224.0.0.1", False, "no delivery can reach"),  # multicast, though "global"
    ("ff02::1", True, "no delivery can reach"),
    ("255.255.255.255", True, "no delivery can reach"),
    ("2002::", True, "no delivery can reach"),  # 6to4 of 0.0.0.0
])
def test_address_refusal(address: str, private_allowed: bool, refused: str | None) -> None:
    why = address_refusal(ipaddress.ip_address(address), private_allowed=private_allowed)
    assert (why is None) if refused is None else (why is not None and refused in why)


@pytest.mark.parametrize(("url", "catalog", "refused"), [
    ("https://hooks.example.com/x", NOTHING, None),
    ("http://hooks.example.com:8080/x?y=1", NOTHING, None),
    ("http://localhost/x", NOTHING, None),  # a name: judged when it is resolved, at each delivery
    ("http://127.0.0.1:8123/hooks/a", ALLOWING, None),
    ("http://127.0.0.1:8123/hooks/../hooks/a", ALLOWING, None),
    ("http://127.0.0.1:8123/hooks/../admin", ALLOWING, "loopback or private"),  # normalized before matching
    ("http://127.0.0.1:8124/hooks/a", ALLOWING, "loopback or private"),
    ("https://127.0.0.1:8123/hooks/a", ALLOWING, "loopback or private"),
    ("http://127.0.0.1:8123/hooks/a", NOTHING, "loopback or private"),
    ("http://10.0.0.7/anything", ALLOWING, None),
    ("http://10.0.0.8/anything", ALLOWING, "loopback or private"),
    ("http://169.254.169.254/latest", ALLOWING, "link-local or metadata"),
    ("http://user@hooks.example.com/", NOTHING, "userinfo"),
    ("file:///etc/passwd", NOTHING, "http(s)"),
    ("https://hooks.example.com/" + "a" * 2048, NOTHING, "at most 2048"),
    ("https://" + "h" * 2036 + ".com", NOTHING, "at most 2048"),  # 2048 as written, 2049 with its "/"
    ("https://hooks.example.com/\x00", NOTHING, "characters"),
    (None, NOTHING, "http(s)"),
    ("http://127.000.000.001:8123/hooks/a", ALLOWING, "four decimal numbers"),
    ("http://127.1:8123/hooks/a", ALLOWING, "four decimal numbers"),
    ("http://0x7f.0.0.1:8123/hooks/a", ALLOWING, "four decimal numbers"),
    ("http://hooks.example.123/", NOTHING, "four decimal numbers"),  # a last label of digits is no name
    ("http://[::127.0.0.1]:8123/hooks/a", ALLOWING, "no delivery can reach"),
    ("http://1.2.3.4.example.com/", NOTHING, None),
])
def test_webhook_url_problem(url: object, catalog, refused: str | None) -> None:
    problem = webhook_url_problem(url, catalog)
    assert (problem is None) if refused is None else (problem is not None and refused in problem), problem


def test_webhooks_allow_is_checked_like_tools_allow() -> None:
    assert ALLOWING.webhooks_allow == ("http://127.0.0.1:8123/hooks/", "http://10.0.0.7/")
    assert ALLOWING.tools_allow == () and not ALLOWING.tool_url_allowed("http://127.0.0.1:8123/hooks/a")
    for bad in ('allow = ["https://u:p@h.example.com/"]', 'allow = [3]', 'allow = "http://h/"',
                'allow = ["ftp://h.example.com/"]'):
        with pytest.raises(CatalogError, match=r"\[webhooks\] allow"):
            parse_catalog(f"[webhooks]\n{bad}\n")


def test_backoff_doubles_from_the_base_up_to_the_cap() -> None:
    settings = Settings(data_dir=".", database_url="sqlite://",  # type: ignore[arg-type]
                        webhooks=WebhookSettings(retry_base_seconds=5.0, retry_max_seconds=3600.0))
    backoff = retry_backoff(settings)
    assert [backoff.nominal(n) for n in range(1, 12)] == [5, 10, 20, 40, 80, 160, 320, 640, 1280, 2560, 3600]


def test_signatures_verify_with_standardwebhooks_and_the_openai_sdk() -> None:
    secret = new_secret()
    assert secret.startswith("whsec_") and len(secret) == len("whsec_") + 44  # 32 random bytes, base64
    body = b'{"id":"evt_1","object":"event","type":"batch.completed","created_at":1,"data":{"id":"batch_1"}}'
    headers = signed_headers(secret, "evt_1", body, int(time.time()))
    assert headers["webhook-id"] == "evt_1" and headers["webhook-signature"].startswith("v1,")
    assert Webhook(secret).verify(body, headers)["data"] == {"id": "batch_1"}
    event = openai.OpenAI(api_key="unused").webhooks.unwrap(body, headers, secret=secret)
    assert event.type == "batch.completed" and event.data.id == "batch_1"
