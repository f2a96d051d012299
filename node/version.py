"""The version Jetraft reports everywhere: INFO, /varz and `jetraft --version`.

It names the nats-server release whose behaviour Jetraft follows, so client
libraries that gate features on the server version see what they expect.
"""

VERSION = "2.15.1-jetraft"
# INFO's "go" field; clients only display it.
GO_VERSION = "python3.11"
