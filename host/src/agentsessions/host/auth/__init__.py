"""Authentication and authorization for the host (``--auth-tokens``; docs/security.md).

``principals`` reads the token file; ``interceptor`` authenticates each call and checks its
method's role; ``access`` checks projects and actors on the call context the interceptor binds.
"""

from agentsessions.host.auth.access import PrincipalAccess
from agentsessions.host.auth.interceptor import AuthInterceptor
from agentsessions.host.auth.principals import AuthFileError, Principal, Principals, load_principals

__all__ = [
    "AuthFileError",
    "AuthInterceptor",
    "Principal",
    "PrincipalAccess",
    "Principals",
    "load_principals",
]
