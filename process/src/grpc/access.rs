//! Which role may call which service: each service is registered with its
//! [`Access`] when a server is put together ([`super::Services::serve`]),
//! so a service cannot be served without saying who may call it.

use std::collections::HashMap;

use crate::security::Role;

/// Who may call a service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Anyone: health checks (Kubernetes probes send no token) and
    /// reflection (the schema is public).
    Open,
    /// Callers presenting the role's token.
    Role(Role),
    /// Callers presenting the role's token, or a verified client
    /// certificate (mutual TLS): for callers that cannot send headers, such
    /// as KEDA's external scaler client.
    RoleOrClientCert(Role),
}

impl Access {
    /// The role whose token lets a call through, if one is needed.
    pub fn role(self) -> Option<Role> {
        match self {
            Access::Open => None,
            Access::Role(r) | Access::RoleOrClientCert(r) => Some(r),
        }
    }
}

/// Every service of a server with its access, by full service name
/// (`loader.v1.AdminService`).
#[derive(Debug, Clone, Default)]
pub struct Policy {
    services: HashMap<&'static str, Access>,
}

impl Policy {
    pub(crate) fn insert(&mut self, service: &'static str, access: Access) {
        self.services.insert(service, access);
    }

    /// The access of the service a request path (`/pkg.Service/Method`)
    /// names; an unknown service is [`Access::Open`] (it is answered
    /// UNIMPLEMENTED, with nothing to protect).
    pub fn of_path(&self, path: &str) -> Access {
        let service = path.trim_start_matches('/').split('/').next().unwrap_or("");
        self.services.get(service).copied().unwrap_or(Access::Open)
    }
}
