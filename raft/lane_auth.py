"""The direct Raft lane's mutual proof of the cluster secret (sans-IO).

With cluster authorization, neither side of a direct lane ever puts the
secret on the wire, and the dialer proves nothing before the acceptor has:

1. dialer -> acceptor: a challenge: a fresh nonce, the dialer's node id, the
   node id it means to reach and the port it dialed;
2. acceptor -> dialer (only for a challenge naming this node and one of its
   lane ports): its own fresh nonce and an HMAC of the transcript under the
   "accept" label;
3. dialer -> acceptor (only once that HMAC checked out): an HMAC of the
   same transcript under the "dial" label.

Why each part: a process squatting on a peer's old ephemeral lane port learns
neither the secret nor a proof it could use (step 3 needs step 2, which needs
the secret). Both nonces make every proof good for one connection only
(no replay); the two labels keep an acceptor's proof from serving as a
dialer's (no reflection); the node ids and the dialed port keep a member from
answering a challenge meant for another node or port (a squatter relaying the
challenge to the real peer, or to the dialer itself, gets a refusal). The
secret is the cluster authorization text every member is configured with
(the same rule as the route `Prove` in node/cluster/security.py). All frames
have fixed sizes, so an unauthenticated peer holds a few dozen bytes.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from dataclasses import dataclass

NONCE = 16
MAC = 32
CHALLENGE_MAGIC = b"JRLANE2C"
ANSWER_MAGIC = b"JRLANE2A"
PROOF_MAGIC = b"JRLANE2P"
_FIELDS = struct.Struct(">QQH")  # dialer id, acceptor id, dialed port
CHALLENGE_SIZE = len(CHALLENGE_MAGIC) + NONCE + _FIELDS.size
ANSWER_SIZE = len(ANSWER_MAGIC) + NONCE + MAC
PROOF_SIZE = len(PROOF_MAGIC) + MAC
_ACCEPT = b"jetraft-lane-accept|"
_DIAL = b"jetraft-lane-dial|"


@dataclass(frozen=True)
class Challenge:
    nonce: bytes  # the dialer's, fresh per connection
    dialer: int
    acceptor: int
    port: int  # the lane port the dialer connected to

    def frame(self) -> bytes:
        return (CHALLENGE_MAGIC + self.nonce
                + _FIELDS.pack(self.dialer, self.acceptor, self.port))

    @classmethod
    def parse(cls, frame: bytes | None) -> Challenge | None:
        if (frame is None or len(frame) != CHALLENGE_SIZE
                or not frame.startswith(CHALLENGE_MAGIC)):
            return None
        at = len(CHALLENGE_MAGIC)
        dialer, acceptor, port = _FIELDS.unpack_from(frame, at + NONCE)
        return cls(frame[at:at + NONCE], dialer, acceptor, port)


def _mac(key: bytes, label: bytes, ch: Challenge, answer_nonce: bytes) -> bytes:
    # Every field has a fixed length, so the concatenation is unambiguous.
    msg = label + ch.nonce + answer_nonce + _FIELDS.pack(ch.dialer, ch.acceptor, ch.port)
    return hmac.new(key, msg, hashlib.sha256).digest()


def answer(key: bytes, ch: Challenge, nonce: bytes) -> bytes:
    """The acceptor's frame: its nonce and its proof."""
    return ANSWER_MAGIC + nonce + _mac(key, _ACCEPT, ch, nonce)


def check_answer(key: bytes, ch: Challenge, frame: bytes | None) -> bytes | None:
    """The acceptor's nonce when its proof is right, else None."""
    if frame is None or len(frame) != ANSWER_SIZE or not frame.startswith(ANSWER_MAGIC):
        return None
    at = len(ANSWER_MAGIC)
    nonce = frame[at:at + NONCE]
    if not hmac.compare_digest(frame[at + NONCE:], _mac(key, _ACCEPT, ch, nonce)):
        return None
    return nonce


def proof(key: bytes, ch: Challenge, answer_nonce: bytes) -> bytes:
    """The dialer's frame, sent only after `check_answer` passed."""
    return PROOF_MAGIC + _mac(key, _DIAL, ch, answer_nonce)


def check_proof(key: bytes, ch: Challenge, answer_nonce: bytes, frame: bytes | None) -> bool:
    if frame is None or len(frame) != PROOF_SIZE or not frame.startswith(PROOF_MAGIC):
        return False
    return hmac.compare_digest(frame[len(PROOF_MAGIC):], _mac(key, _DIAL, ch, answer_nonce))
