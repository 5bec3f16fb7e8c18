//! moto's standalone S3 server (`moto_server`, from PyPI), the real S3 API
//! the object-storage tests read through, and boto3 to fill its buckets.
//! Both come from the virtualenv whose Python `LOADER_PYTHON` names
//! (test.sh installs `moto[server]` there).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::proc::Proc;
use crate::scope::Scope;

/// How long moto may take to print the address it listens on.
const STARTUP: Duration = Duration::from_secs(30);

/// The virtualenv's Python (test.sh's `LOADER_PYTHON`), whose `bin` holds
/// `moto_server` and boto3; `Err` says what is missing (pass it to
/// [`needs`](crate::needs)).
pub fn python() -> Result<PathBuf, String> {
    const INSTALL: &str = "test.sh makes one: target/test-venv with moto[server]";
    let python = std::env::var_os("LOADER_PYTHON").map(PathBuf::from);
    let python = python.ok_or_else(|| format!("LOADER_PYTHON is not set ({INSTALL}, and sets it)"))?;
    let server = python.with_file_name("moto_server");
    if !server.exists() {
        return Err(format!("no {} beside LOADER_PYTHON ({INSTALL})", server.display()));
    }
    Ok(python)
}

/// Starts `moto_server` from `python`'s virtualenv on a loopback port;
/// the process (killed when dropped) and its endpoint (`http://127.0.0.1:PORT`).
pub fn start(scope: &Scope, python: &Path) -> (Proc, String) {
    let mut moto = Command::new(python.with_file_name("moto_server"));
    moto.args(["-H", "127.0.0.1", "-p", "0"]);
    let moto = Proc::spawn_capturing_stderr(scope, "moto_server", moto, false);
    let endpoint = wait_for_endpoint(&moto);
    (moto, endpoint)
}

/// Points this process's AWS settings (and so every process it starts
/// afterwards: cluster, loaderctl) at moto's `endpoint`, with its test
/// credentials.
///
/// # Safety
/// Called before the test starts any thread that reads the environment
/// (moto's output readers read none), as `std::env::set_var` requires.
pub unsafe fn aim_aws_at(endpoint: &str) {
    // SAFETY: the caller's contract: no other thread reads the environment.
    unsafe {
        std::env::set_var("AWS_ENDPOINT_URL", endpoint);
        std::env::set_var("AWS_ACCESS_KEY_ID", "test");
        std::env::set_var("AWS_SECRET_ACCESS_KEY", "test");
        std::env::set_var("AWS_REGION", "us-east-1");
    }
}

/// Writes `ids` uint16 token ids to `path`: a token file whose every
/// window differs.
pub fn write_tokens(path: &Path, ids: u32) {
    let bytes: Vec<u8> = (0..ids).flat_map(|i| (i.wrapping_mul(2_654_435_761) as u16).to_le_bytes()).collect();
    std::fs::write(path, bytes).expect("write tokens");
}

/// Runs `code` in the virtualenv's Python with boto3 pointed at `endpoint`.
pub fn boto3(python: &Path, endpoint: &str, code: &str) {
    let prelude = format!(
        "import boto3\ns3 = boto3.client('s3', endpoint_url={endpoint:?}, aws_access_key_id='test', \
         aws_secret_access_key='test', region_name='us-east-1')\n"
    );
    let status = Command::new(python).arg("-c").arg(prelude + code).status().expect("run python");
    assert!(status.success(), "boto3: {code}");
}

/// moto's `Running on http://127.0.0.1:PORT` line (on stderr), within
/// [`STARTUP`].
pub fn wait_for_endpoint(moto: &Proc) -> String {
    crate::wait::wait_for("moto_server printing its address", STARTUP, || {
        let stderr = moto.stderr();
        let url = stderr.iter().find_map(|l| l.split("Running on ").nth(1).map(|u| u.trim().to_owned()));
        url.ok_or_else(|| format!("its stderr: {stderr:?}"))
    })
}
