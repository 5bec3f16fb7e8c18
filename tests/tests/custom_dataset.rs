//! A custom worker binary (`examples/custom-worker`) serving a dataset of
//! its own through the `Dataset` trait, with the stock coordinator and SDK;
//! and a stock worker refusing that job with a message that says why.

use std::process::Command;
use std::time::Duration;

use loader_client::{Dtype, Loader, spec};
use loader_e2e::{Cluster, binary, run};

#[test]
fn a_custom_worker_serves_its_registered_dataset() {
    const N: u64 = 100;
    const OFFSET: u64 = 5;
    let job = spec::custom("squares", N, [("offset", OFFSET.to_string())])
        .batch_size(16)
        .epochs(2)
        .shuffle(9)
        .build()
        .expect("custom spec");
    let seen = run(Duration::from_secs(120), move |scope| {
        let mut cluster = Cluster::start(&scope, 0);
        let mut command = Command::new(binary("custom-worker"));
        command.args(["--coordinator", &cluster.url(), "--listen", "127.0.0.1:0"]);
        cluster.add_worker_command(command);
        cluster.wait_for_workers(1);
        let loader = Loader::builder(cluster.url()).job(job).build().expect("loader");
        let mut seen = Vec::new();
        for batch in loader {
            let batch = batch.expect("batch");
            let x: Vec<f32> = batch.tensor("x").expect("x").to_vec().expect("float32 x");
            let y: Vec<i64> = batch.tensor("y").expect("y").to_vec().expect("int64 y");
            assert_eq!(batch.tensor("x").expect("x").dtype, Dtype::F32);
            for (k, &i) in batch.indices().iter().enumerate() {
                seen.push((i, x[k], y[k]));
            }
        }
        seen
    });
    assert_eq!(seen.len() as u64, 2 * N);
    for (i, x, y) in seen {
        let v = i + OFFSET;
        assert_eq!((x, y), (v as f32, (v * v) as i64), "sample {i}");
    }
}

#[test]
fn a_stock_worker_refuses_a_custom_dataset_by_name() {
    let job = spec::custom("squares", 10, [("offset", "1")]).batch_size(5).build().expect("custom spec");
    let outcome = run(Duration::from_secs(60), move |scope| {
        let cluster = Cluster::start(&scope, 1);
        let loader = Loader::builder(cluster.url()).job(job).build().expect("loader");
        loader.into_iter().map(|b| b.map(|_| ())).collect::<Result<Vec<()>, _>>().map_err(|e| e.to_string())
    });
    let error = outcome.expect_err("a stock worker cannot serve it");
    assert!(error.contains("this worker has no dataset `squares`"), "{error}");
}
