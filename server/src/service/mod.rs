//! The gRPC services: thin adapters from messages to [`Coordinator`] calls.
//!
//! [`Coordinator`]: crate::coordinator::Coordinator

pub(crate) mod admin;
pub(crate) mod keda;
pub(crate) mod trainer;
pub(crate) mod worker;
