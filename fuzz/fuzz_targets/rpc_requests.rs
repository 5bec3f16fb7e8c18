//! Every RPC's request handling: a sequence of calls, each a request of one
//! RPC decoded from arbitrary bytes, through the coordinator's real
//! services (in memory, fresh for each input) and the worker's real
//! `BatchService.Fetch` (through its generated gRPC server, so tonic's
//! framing of the request stream is in the path). Errors are fine; a panic
//! is a finding. See `loader_fuzz::rpc` for the input format.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    loader_fuzz::rpc::run(data);
});
