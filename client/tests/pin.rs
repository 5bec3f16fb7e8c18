//! The pin-memory stage against real worker processes, on the host
//! backend (`Device::Host`: copies complete asynchronously and out of
//! order, on every machine): every batch in order with the bytes the
//! workers wrote, the ring's slots all back at the end, exact resumption
//! with copies queued at the interruption, and the one-line error for a GPU
//! this machine cannot use. Each test is bounded in time; dropping a loader
//! stops the processes it started.
#![cfg(feature = "embedded")]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use loader_client::{DEFAULT_SLOT_SIZE, Device, Dtype, JobSpec, Loader, LoaderError, spec};

use common::{bounded, worker_command};

fn job() -> JobSpec {
    spec::synthetic(200, &[3, 16, 16], Dtype::U8)
        .batch_size(8)
        .epochs(2)
        .shuffle(5)
        .build()
        .expect("spec")
}

/// Every batch of a run on `device`: seq -> the frame's bytes (read back
/// from the device for a device batch).
fn run(device: Device) -> BTreeMap<u64, Vec<u8>> {
    let mut loader = Loader::local_builder(job(), 2)
        .worker_command(worker_command())
        .prefetch(2)
        .ring(6, DEFAULT_SLOT_SIZE)
        .device(device)
        .device_prefetch(2)
        .build()
        .expect("loader");
    assert_eq!(loader.device(), device);
    let mut seen = BTreeMap::new();
    let mut last = None;
    for batch in loader.by_ref() {
        let batch = batch.expect("batch");
        assert!(
            last.is_none_or(|l| batch.seq() == l + 1),
            "in order: {last:?} then {}",
            batch.seq()
        );
        last = Some(batch.seq());
        let bytes = match batch.on_device() {
            Some(copy) => {
                assert_eq!(batch.device(), device);
                // Device tensors sit where the header says, in the copy.
                let data = batch.device_tensor("data").expect("data");
                assert_eq!(data.shape, &[batch.len() as u64, 3, 16, 16]);
                assert!(
                    data.ptr >= copy.ptr()
                        && data.ptr + data.len as u64 <= copy.ptr() + copy.len() as u64
                );
                copy.read_back().expect("read back")
            }
            None => batch.bytes().to_vec(),
        };
        seen.insert(batch.seq(), bytes);
    }
    // Every slot went back to the workers once its copy completed (the
    // loader's stage is idle: nothing queued, nothing held).
    if device.is_staged() {
        let (held, most) = loader.device_buffers().expect("a stage");
        assert_eq!(held, 0, "of {most} device buffers");
    }
    seen
}

#[test]
fn device_batches_are_in_order_and_byte_for_byte_the_host_batches() {
    bounded(Duration::from_secs(120), || {
        let host = run(Device::Cpu);
        let device = run(Device::Host);
        assert_eq!(host.len(), 50);
        assert_eq!(
            host.keys().collect::<Vec<_>>(),
            device.keys().collect::<Vec<_>>()
        );
        for (seq, bytes) in &host {
            assert!(device[seq] == *bytes, "batch {seq} differs on the device");
        }
    });
}

#[test]
fn a_resumed_device_loader_yields_exactly_the_rest() {
    bounded(Duration::from_secs(120), || {
        let open = |builder: loader_client::LoaderBuilder| {
            builder
                .worker_command(worker_command())
                .prefetch(2)
                .ring(6, DEFAULT_SLOT_SIZE)
                .device(Device::Host)
                .device_prefetch(3)
                .build()
                .expect("loader")
        };
        let mut first = open(Loader::local_builder(job(), 2));
        let mut seqs = Vec::new();
        for _ in 0..7 {
            let batch = first.next().expect("some").expect("batch");
            seqs.push(batch.seq());
        }
        // Copies are queued ahead of the 7th batch; the state counts only
        // the batches yielded.
        let state = first.state();
        assert_eq!(first.yielded(), 7);
        drop(first);
        let mut second = open(Loader::local_builder(job(), 2).resume(state));
        for batch in second.by_ref() {
            seqs.push(batch.expect("batch").seq());
        }
        assert_eq!(seqs, (0..50).collect::<Vec<_>>());
    });
}

#[test]
fn a_gpu_this_machine_cannot_use_is_one_line_and_auto_falls_back() {
    bounded(Duration::from_secs(120), || {
        let gpu = Loader::local_builder(job(), 1)
            .worker_command(worker_command())
            .device(Device::Cuda(7))
            .build();
        match gpu {
            // A machine with eight GPUs and a build with the feature.
            Ok(loader) => assert_eq!(loader.device(), Device::Cuda(7)),
            Err(e) => {
                assert!(matches!(e, LoaderError::Device(_)), "{e:?}");
                let e = e.to_string();
                assert!(e.starts_with("device cuda:7: ") && !e.contains('\n'), "{e}");
            }
        }
        let mut auto = Loader::local_builder(job(), 1)
            .worker_command(worker_command())
            .device(Device::Auto)
            .build()
            .expect("auto always opens");
        assert!(
            matches!(auto.device(), Device::Cpu | Device::Cuda(0)),
            "{:?}",
            auto.device()
        );
        let batch = auto.next().expect("some").expect("batch");
        assert_eq!(batch.device(), auto.device());
    });
}
