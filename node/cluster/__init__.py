"""The cluster layer: membership, routes, and the shared gRPC cluster port."""

from node.cluster.members import Member
from node.cluster.service import Cluster, RequestError

__all__ = ["Cluster", "Member", "RequestError"]
