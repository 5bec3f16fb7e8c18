//! [`Device`]: where a loader's batches land, as the options say it
//! (`"cpu"`, `"cuda"`, `"cuda:N"`, `"auto"`, `"host"`).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Where the batches a loader yields live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Device {
    /// Host memory, no pin-memory stage: the batch views its ring slot or
    /// gRPC frame (the default).
    #[default]
    Cpu,
    /// NVIDIA GPU `N` (`"cuda"` is `"cuda:0"`): each batch is copied from
    /// the ring to device memory by the pin-memory stage (feature `cuda`).
    /// A machine without a usable GPU is an error saying why.
    Cuda(u32),
    /// GPU 0 when one is usable, else the host (one log line says which).
    Auto,
    /// The pin-memory stage with host memory standing in for the device:
    /// copies complete asynchronously and out of order on a small thread
    /// pool, under every rule of the GPU path (device pool, one event per
    /// batch, slot returned after the event, in-order delivery). For tests
    /// and for checking the stage on a machine with no GPU; slower than
    /// `cpu`.
    Host,
}

impl Device {
    /// True when batches go through the pin-memory stage.
    pub fn is_staged(self) -> bool {
        !matches!(self, Device::Cpu)
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
            Device::Auto => f.write_str("auto"),
            Device::Host => f.write_str("host"),
        }
    }
}

/// A device string that names no device; one line, with the accepted forms.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid device {0:?}: expected \"cpu\", \"cuda\", \"cuda:N\", \"auto\" or \"host\"")]
pub struct BadDevice(String);

impl FromStr for Device {
    type Err = BadDevice;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || BadDevice(s.to_owned());
        match s.trim().to_ascii_lowercase().as_str() {
            "cpu" => Ok(Device::Cpu),
            "cuda" | "gpu" => Ok(Device::Cuda(0)),
            "auto" => Ok(Device::Auto),
            "host" => Ok(Device::Host),
            other => other
                .strip_prefix("cuda:")
                .and_then(|n| n.parse::<u32>().ok())
                .map(Device::Cuda)
                .ok_or_else(bad),
        }
    }
}

impl TryFrom<String> for Device {
    type Error = BadDevice;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<Device> for String {
    fn from(d: Device) -> Self {
        d.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_form_and_prints_it_back() {
        for (text, device, printed) in [
            ("cpu", Device::Cpu, "cpu"),
            ("cuda", Device::Cuda(0), "cuda:0"),
            ("CUDA:3", Device::Cuda(3), "cuda:3"),
            ("auto", Device::Auto, "auto"),
            ("host", Device::Host, "host"),
        ] {
            let parsed: Device = text.parse().expect(text);
            assert_eq!(parsed, device);
            assert_eq!(parsed.to_string(), printed);
            assert_eq!(printed.parse::<Device>().expect(printed), device);
        }
        assert!(!Device::Cpu.is_staged() && Device::Cuda(1).is_staged());
    }

    #[test]
    fn a_bad_device_is_one_line_with_the_forms() {
        for text in ["tpu", "cuda:", "cuda:-1", "cuda:x", ""] {
            let e = text.parse::<Device>().expect_err(text).to_string();
            assert!(
                e.starts_with("invalid device") && e.contains("\"cuda:N\""),
                "{e}"
            );
            assert!(!e.contains('\n'));
        }
    }
}
