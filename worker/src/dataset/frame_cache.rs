//! [`FrameCache`]: the built-in image datasets' kept frames
//! ([`crate::image::frames`]) in a [`SampleCache`], the file a
//! `Loader.local(spec, cache=...)` trainer creates and its forked workers
//! share, and [`CachePayoff`]: whether keeping them pays, the one rule
//! that `loader._cache` (a Python dataset's sample cache) decides by too.
//!
//! Keys: a frame of sample `i` at DCT scale `8 >> k` is entry `i * 4 + k`,
//! so a cache for `n` samples has `n * SCALES` entries (most stay empty: a
//! sample's crops usually ask for one scale). An entry is a 16-byte header
//! (source, scale, crop alignment, full size) and the frame's RGBX rows.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use nix::sys::mman::{MmapAdvise, madvise};

use crate::image::ImageError;
use crate::image::frames::{Frame, Frames, Source, thread_cpu};
use crate::sample_cache::on_node::{self, NodeHold};
use crate::sample_cache::{Off, Put, SampleCache, Stats};

/// Entries per sample: one per DCT scale (8, 4, 2, 1 eighths). A trainer
/// makes the cache for `samples * FRAMES_PER_SAMPLE` entries.
pub const FRAMES_PER_SAMPLE: u64 = 4;
const SCALES: u64 = FRAMES_PER_SAMPLE;

/// For a built-in image job (`image_folder`, `webdataset`): how many
/// entries the sample cache its workers share needs (a frame per sample and
/// DCT scale); None for any other dataset, whose pipeline keeps nothing.
pub fn cache_entries(spec: &loader_proto::pb::JobSpec) -> Result<Option<u64>, String> {
    use loader_proto::pb::dataset_spec::Kind;
    let samples = match spec.dataset.as_ref().and_then(|d| d.kind.as_ref()) {
        Some(Kind::ImageFolder(f)) => f.num_samples,
        Some(Kind::Webdataset(w)) => w.shard_samples.iter().sum(),
        _ => return Ok(None),
    };
    samples.checked_mul(FRAMES_PER_SAMPLE).map(Some).ok_or_else(|| format!("cache: {samples} images is too many to cache"))
}

/// Bytes before an entry's pixels.
const HEADER: usize = 16;
/// The header's first byte.
const JPEG: u8 = 1;
const PNG: u8 = 2;

/// Look at the counters every this many samples.
const DECIDE_EVERY: u64 = 16;

/// How long a read waits for a frame another worker is keeping at that
/// moment (co-located workers in different epochs meet on one image): a
/// decode takes milliseconds, and waiting for it beats decoding the image
/// a second time.
const TAKEN_WAIT: Duration = Duration::from_millis(200);

/// Frames kept in a shared sample cache.
#[derive(Debug)]
pub struct FrameCache {
    cache: SampleCache,
    /// Samples of the job (the cache has `samples * SCALES` entries).
    samples: u64,
    /// Epochs the job reads each sample in: what a kept frame saves.
    epochs: u32,
    /// The space ran out: decode only regions from now on (no whole
    /// frames that could not be kept).
    full: AtomicBool,
    /// This worker has said that the cache pays.
    decided: AtomicBool,
    /// Samples made through the cache by this worker.
    seen: AtomicU64,
    /// A cache this worker made itself (`loader-worker --cache`) holds
    /// its worker's one slot for as long as it lives (see
    /// `registry::OwnFrames`).
    _slot: Option<std::sync::Arc<()>>,
    /// A cache the workers of this node share (`--cache-shared`): this
    /// worker's hold on its file, which the last holder unlinks.
    _node: Option<NodeHold>,
}

impl FrameCache {
    /// Keeps frames of a job of `samples` samples read in `epochs` epochs
    /// in `cache` (made for `samples * SCALES` entries). A job of one
    /// epoch reads no frame twice: the cache is turned off at once.
    pub fn new(cache: SampleCache, samples: u64, epochs: u32) -> Self {
        if epochs <= 1 {
            cache.turn_off(Off::OneEpoch);
        }
        Self {
            cache,
            samples,
            epochs,
            full: AtomicBool::new(false),
            decided: AtomicBool::new(false),
            seen: AtomicU64::new(0),
            _slot: None,
            _node: None,
        }
    }

    /// A cache of `capacity` bytes this worker makes for itself (in
    /// memory, or an unnamed file in `dir`) for a job of `samples`
    /// samples and `epochs` epochs, holding `slot` while it lives.
    pub(crate) fn own(samples: u64, epochs: u32, capacity: u64, dir: Option<&std::path::Path>, slot: std::sync::Arc<()>) -> Result<Self, String> {
        let entries = samples.checked_mul(SCALES).ok_or_else(|| format!("sample cache: {samples} samples is too many"))?;
        let cache = SampleCache::create(entries, capacity, dir).map_err(|e| e.to_string())?;
        Ok(Self { _slot: Some(slot), ..Self::new(cache, samples, epochs) })
    }

    /// The cache of `capacity` bytes that the workers of this node started
    /// with `--cache-shared` share for a job of `samples` samples and
    /// `epochs` epochs: the file `name` in `dir`, made here if no live
    /// worker has it. Holds `slot` while it lives.
    pub(crate) fn on_node(
        samples: u64,
        epochs: u32,
        capacity: u64,
        dir: &std::path::Path,
        name: &str,
        slot: std::sync::Arc<()>,
    ) -> Result<Self, String> {
        let entries = samples.checked_mul(SCALES).ok_or_else(|| format!("sample cache: {samples} samples is too many"))?;
        let (cache, hold) = on_node::open_or_make(dir, name, entries, capacity).map_err(|e| e.to_string())?;
        Ok(Self { _slot: Some(slot), _node: Some(hold), ..Self::new(cache, samples, epochs) })
    }

    /// The cache this worker inherited from its trainer, if any, for a job
    /// of `samples` samples and `epochs` epochs. A cache made for another
    /// job is an error naming both sizes.
    pub fn inherited(samples: u64, epochs: u32) -> Result<Option<Self>, String> {
        let entries = samples.checked_mul(SCALES).ok_or_else(|| format!("sample cache: {samples} samples is too many"))?;
        match SampleCache::inherited(entries) {
            Ok(Some(cache)) => Ok(Some(Self::new(cache, samples, epochs))),
            Ok(None) => Ok(None),
            Err(e) => Err(format!("{e} (a job of {samples} images keeps {SCALES} frames a sample)")),
        }
    }

    fn key(&self, index: u64, scale: u32) -> Option<u64> {
        let k = match scale {
            8 => 0,
            4 => 1,
            2 => 2,
            1 => 3,
            _ => return None,
        };
        (index < self.samples).then(|| index * SCALES + k)
    }

    fn parse(entry: &[u8]) -> Option<Frame<'_>> {
        let (head, pixels) = entry.split_at_checked(HEADER)?;
        let word = |at: usize| head.get(at..at + 4).and_then(|b| b.try_into().ok()).map(u32::from_le_bytes);
        let source = match head[0] {
            JPEG => Source::Jpeg { align: word(4)? },
            PNG => Source::Png,
            _ => return None,
        };
        Some(Frame { source, full: (word(8)?, word(12)?), scale: u32::from(head[1]), pixels })
    }

    /// Once enough is timed, and again every [`DECIDE_EVERY`] samples while
    /// frames are still being kept (stores cost more once co-located
    /// workers fill the file together than at the start): turns the cache
    /// off for every worker when keeping frames does not pay for this job,
    /// and says so; says once that it pays.
    fn tick(&self) {
        let seen = self.seen.fetch_add(1, Ordering::Relaxed) + 1;
        if !seen.is_multiple_of(DECIDE_EVERY) || !self.cache.is_on() {
            return;
        }
        let s = self.cache.stats();
        let Some(payoff) = CachePayoff::of(&s, self.epochs) else {
            return;
        };
        let costs = || {
            format!(
                "reading and decoding an image takes {:.1} us, keeping its frame {:.1} us, cutting a sample out of a kept frame {:.1} us (CPU, over {} frames)",
                payoff.load / 1e3,
                payoff.store / 1e3,
                payoff.hit / 1e3,
                s.loads
            )
        };
        if !payoff.pays {
            self.cache.turn_off(Off::DoesNotPay);
            tracing::info!(target: "loader_worker::sample_cache", "sample cache off for this job of {} epochs: {}", self.epochs, costs());
        } else if !self.decided.swap(true, Ordering::Relaxed) {
            tracing::info!(target: "loader_worker::sample_cache", "sample cache on for this job of {} epochs: {}", self.epochs, costs());
        }
    }
}

/// Timed loads and timed reads back, over every worker sharing a cache,
/// before it decides whether it pays. 32: a decode's time varies with the
/// image's size and a Python load's with what the first samples import
/// and warm, so fewer (8) let one odd sample turn a paying cache off for
/// good; more would keep a cache that does not pay storing for longer.
/// Both caches time a read back as soon as they store (a cut out of the
/// kept frame; `loader._cache` reads this many entries back), so they
/// decide in the first epoch with one worker as with many.
pub const DECIDE_AFTER: u64 = 32;

/// A hit must cost under this share of a load: below it a hit saves at
/// least half a load, above it the copies and the memory buy little.
const PAYS_BELOW: f64 = 0.5;

/// Whether keeping the loaded half of samples (an image's decoded frame,
/// a Python dataset's `loader_load`) pays for a job: the one rule of the
/// worker's [`FrameCache`] and of `loader._cache` (through
/// `SampleCache.payoff` in the Python module), from what the cache timed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CachePayoff {
    /// Nanoseconds a sample takes to load (read and decode), on average.
    pub load: f64,
    /// Nanoseconds storing its loaded half takes, on average.
    pub store: f64,
    /// Nanoseconds reading that back takes, on average.
    pub hit: f64,
    /// A hit costs under half a load, and what the later epochs save is
    /// at least twice what storing costs in the first.
    pub pays: bool,
}

impl CachePayoff {
    /// The payoff of a job of `epochs` epochs from a cache's counters;
    /// None until [`DECIDE_AFTER`] loads and reads back are timed.
    pub fn of(stats: &Stats, epochs: u32) -> Option<Self> {
        if stats.loads < DECIDE_AFTER || stats.hits_timed < DECIDE_AFTER {
            return None;
        }
        let avg = |total: u64, n: u64| total as f64 / n.max(1) as f64;
        let (load, store, hit) = (avg(stats.load_nanos, stats.loads), avg(stats.store_nanos, stats.stores_timed), avg(stats.hit_nanos, stats.hits_timed));
        Some(Self { load, store, hit, pays: pays(load, store, hit, epochs) })
    }
}

fn pays(load: f64, store: f64, hit: f64, epochs: u32) -> bool {
    hit < PAYS_BELOW * load && f64::from(epochs.saturating_sub(1)) * (load - hit) >= 2.0 * store
}

impl FrameCache {
    /// The frame another worker is keeping under `key` right now, once it
    /// is published; None if that takes longer than [`TAKEN_WAIT`] or the
    /// other worker gives up (its decode failed, or it died mid-write).
    fn kept_by_another(&self, key: u64, index: u64, scale: u32) -> Option<Frame<'_>> {
        let deadline = std::time::Instant::now() + TAKEN_WAIT;
        while self.cache.claimed(key) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_micros(200));
        }
        self.get(index, scale)
    }
}

impl Frames for FrameCache {
    fn known(&self, index: u64) -> Option<(Source, (u32, u32))> {
        [8, 4, 2, 1].into_iter().find_map(|scale| self.get(index, scale).map(|f| (f.source, f.full)))
    }

    fn get(&self, index: u64, scale: u32) -> Option<Frame<'_>> {
        let entry = self.cache.get(self.key(index, scale)?)?;
        Self::parse(entry).filter(|f| f.scale == scale)
    }

    fn keep(
        &self,
        index: u64,
        scale: u32,
        full: (u32, u32),
        pixels: usize,
        decode: &mut dyn FnMut(&mut [u8]) -> Result<Source, ImageError>,
    ) -> Option<Result<(Frame<'_>, bool), ImageError>> {
        let key = self.key(index, scale)?;
        if !self.cache.is_on() {
            return None;
        }
        // A read that missed, counted as the sample cache of a Python
        // dataset counts it, whatever stops the frame being kept.
        if self.full.load(Ordering::Relaxed) {
            self.cache.record_untimed_miss();
            return None;
        }
        let mut failed = None;
        let put = self.cache.put_with(key, (HEADER + pixels) as u64, |area| {
            // The cache's fresh pages, all at once: what keeping costs
            // beyond the decode (faulting them in one by one while decoding
            // costs more, and would count as decoding).
            let began = thread_cpu();
            populate(area);
            self.cache.time_store(nanos(thread_cpu().saturating_sub(began)));
            let (head, body) = area.split_at_mut(HEADER);
            match decode(body) {
                Ok(source) => {
                    head.copy_from_slice(&header(source, scale, full));
                    true
                }
                Err(e) => {
                    failed = Some(e);
                    false
                }
            }
        });
        match put {
            Put::Stored => self.get(index, scale).map(|f| Ok((f, true))),
            Put::Full => {
                self.full.store(true, Ordering::Relaxed);
                self.cache.record_untimed_miss();
                None
            }
            // Another worker is keeping it (it makes this sample for an
            // earlier epoch right now): its frame, once kept, within a
            // bounded wait (a decode takes milliseconds); else this one is
            // made as uncached.
            Put::Taken => match self.kept_by_another(key, index, scale) {
                Some(frame) => Some(Ok((frame, false))),
                None => {
                    self.cache.record_untimed_miss();
                    None
                }
            },
            Put::Refused => failed.map(Err),
        }
    }

    fn hit(&self, took: Duration) {
        self.cache.record_hit(Some(nanos(took)));
        self.tick();
    }

    fn miss(&self, decode: Duration, cut: Duration) {
        self.cache.record_miss(nanos(decode));
        // What a hit will cost, known before the first hit of a later epoch.
        self.cache.time_hit(Some(nanos(cut)));
        self.tick();
    }
}

/// Asks the kernel for `area`'s pages, writable, in one call
/// (`MADV_POPULATE_WRITE`); on a kernel without it (before 5.14) the writes
/// fault them in instead.
fn populate(area: &mut [u8]) {
    const PAGE: usize = 4096;
    let start = area.as_mut_ptr() as usize;
    let first = start / PAGE * PAGE;
    let Some(addr) = std::ptr::NonNull::new(first as *mut std::ffi::c_void) else {
        return;
    };
    // SAFETY: [first, start + len) lies within the cache's mapping: `area`
    // does, and `first` only rounds its start down to the page holding it,
    // which the (page-aligned) mapping covers. MADV_POPULATE_WRITE maps the
    // pages writable without touching their contents, so the bytes of the
    // entry sharing that first page are left as they are.
    let _ = unsafe { madvise(addr, start + area.len() - first, MmapAdvise::MADV_POPULATE_WRITE) };
}

/// An entry's header: source, scale, crop alignment, full size.
fn header(source: Source, scale: u32, full: (u32, u32)) -> [u8; HEADER] {
    let (kind, align) = match source {
        Source::Jpeg { align } => (JPEG, align),
        Source::Png => (PNG, 0),
    };
    let mut head = [0u8; HEADER];
    head[0] = kind;
    head[1] = u8::try_from(scale).unwrap_or(0);
    head[4..8].copy_from_slice(&align.to_le_bytes());
    head[8..12].copy_from_slice(&full.0.to_le_bytes());
    head[12..16].copy_from_slice(&full.1.to_le_bytes());
    head
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pays_when_hits_are_cheap_and_later_epochs_repay_the_stores() {
        // Decoding 4 ms, keeping 0.3 ms, cutting 0.1 ms: pays from 2 epochs.
        assert!(pays(4e6, 3e5, 1e5, 2));
        assert!(!pays(4e6, 3e5, 1e5, 1));
        // A hit as dear as a decode never pays.
        assert!(!pays(1e5, 1e4, 9e4, 10));
    }

    #[test]
    fn a_payoff_waits_for_enough_timings_then_averages_them() {
        let timed = |loads: u64, hits: u64| Stats {
            load_nanos: loads * 4_000_000,
            loads,
            hit_nanos: hits * 100_000,
            hits_timed: hits,
            store_nanos: loads * 300_000,
            stores_timed: loads,
            ..Stats::default()
        };
        assert_eq!(CachePayoff::of(&timed(DECIDE_AFTER - 1, DECIDE_AFTER), 2), None);
        assert_eq!(CachePayoff::of(&timed(DECIDE_AFTER, DECIDE_AFTER - 1), 2), None);
        let payoff = CachePayoff::of(&timed(DECIDE_AFTER, DECIDE_AFTER), 2).expect("decided");
        assert_eq!((payoff.load, payoff.store, payoff.hit, payoff.pays), (4e6, 3e5, 1e5, true));
        assert!(!CachePayoff::of(&timed(DECIDE_AFTER, DECIDE_AFTER), 1).expect("decided").pays);
    }

    #[test]
    fn a_frame_reads_back_as_it_was_kept_and_a_full_cache_stops_whole_decodes() {
        let cache = SampleCache::create(3 * SCALES, 4096, None).expect("cache");
        let frames = FrameCache::new(cache, 3, 2);
        assert!(frames.known(1).is_none());
        let mut sevens = |into: &mut [u8]| {
            into.fill(7);
            Ok(Source::Jpeg { align: 16 })
        };
        let (got, decoded) = frames.keep(1, 4, (6, 4), 4 * 3 * 2, &mut sevens).expect("room").expect("decoded");
        assert!(decoded);
        assert_eq!((got.source, got.full, got.scale, got.pixels), (Source::Jpeg { align: 16 }, (6, 4), 4, &[7u8; 24][..]));
        assert_eq!(frames.get(1, 4).map(|f| f.pixels.len()), Some(24));
        assert_eq!(frames.known(1), Some((Source::Jpeg { align: 16 }, (6, 4))));
        assert!(frames.get(1, 8).is_none() && frames.get(0, 4).is_none());
        let mut never = |_: &mut [u8]| -> Result<Source, ImageError> { panic!("not called") };
        let (again, decoded) = frames.keep(1, 4, (6, 4), 24, &mut never).expect("kept already").expect("a frame");
        assert!(!decoded && again.pixels == &[7u8; 24][..], "kept already: the kept frame, not decoded again");
        assert!(frames.keep(3, 8, (6, 4), 24, &mut never).is_none(), "no sample 3");
        let mut broken = |_: &mut [u8]| Err(ImageError::Corrupt("truncated".into()));
        assert!(matches!(frames.keep(0, 8, (6, 4), 24, &mut broken), Some(Err(ImageError::Corrupt(_)))));
        assert!(frames.get(0, 8).is_none(), "a failed decode keeps nothing");
        assert!(frames.keep(2, 8, (64, 32), 8192, &mut never).is_none(), "no room");
        assert!(frames.keep(2, 4, (6, 4), 24, &mut never).is_none(), "the space ran out: regions only");
    }

    #[test]
    fn a_file_cut_short_gives_what_it_gives_without_a_cache() {
        // The whole image cannot decode; a region above the cut can: kept
        // frames must not turn that sample into an error (nor the reverse).
        let whole = jpeg(240, 320, 9, false);
        let rrc = t(Op::RandomResizedCrop(pb::RandomResizedCrop { size: vec![32], scale: vec![0.05, 0.2], ratio: vec![0.75, 1.33], ..Default::default() }));
        let pipeline = Pipeline::new(&[t(Op::Decode(pb::Decode {})), rrc]).expect("pipeline");
        let (mut same_ok, mut same_err) = (0, 0);
        for cut_at in [whole.len() / 3, whole.len() / 2, whole.len() * 3 / 4] {
            let file = &whole[..cut_at];
            let frames = FrameCache::new(SampleCache::create(SCALES, 8 << 20, None).expect("cache"), 1, 3);
            for epoch in 0..8 {
                let key = SampleKey { seed: 3, epoch, index: 0 };
                let mut plain = vec![0u8; pipeline.output_bytes()];
                let plain_made = pipeline.run(file, key, &mut plain);
                let mut kept = vec![0u8; pipeline.output_bytes()];
                let kept_made = pipeline.run_kept(key, &mut kept, &frames, || Ok(file));
                match (plain_made, kept_made) {
                    (Ok(()), Ok(())) => {
                        assert!(plain == kept, "cut at {cut_at}, epoch {epoch}");
                        same_ok += 1;
                    }
                    (Err(a), Err(b)) => {
                        assert_eq!(a.to_string(), b.to_string());
                        same_err += 1;
                    }
                    (a, b) => panic!("cut at {cut_at}, epoch {epoch}: {a:?} without frames, {b:?} with"),
                }
            }
        }
        assert!(same_ok > 0 && same_err > 0, "both outcomes seen: {same_ok} made, {same_err} refused");
    }

    #[test]
    fn a_one_epoch_job_keeps_nothing() {
        let frames = FrameCache::new(SampleCache::create(SCALES, 4096, None).expect("cache"), 1, 1);
        let mut never = |_: &mut [u8]| -> Result<Source, ImageError> { panic!("not called") };
        assert!(frames.keep(0, 8, (6, 4), 24, &mut never).is_none());
        assert_eq!(frames.cache.stats().off, Some(Off::OneEpoch));
    }

    use std::cell::Cell;

    use loader_proto::pb::{self, Layout, Transform, transform::Op};

    use crate::dataset::SampleKey;
    use crate::image::Pipeline;

    fn t(op: Op) -> Transform {
        Transform { op: Some(op) }
    }

    fn noise(n: usize, mut state: u64) -> Vec<u8> {
        (0..n)
            .map(|_| {
                state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                (state >> 56) as u8
            })
            .collect()
    }

    /// A 4:2:0 JPEG (or a greyscale one) of noise over a gradient.
    fn jpeg(w: u32, h: u32, seed: u64, grey: bool) -> Vec<u8> {
        let rgb: Vec<u8> = noise((w * h * 3) as usize, seed).iter().enumerate().map(|(i, n)| n / 2 + (i % 251) as u8 / 2).collect();
        let mut out = Vec::new();
        let mut e = jpeg_encoder::Encoder::new(&mut out, 90);
        if grey {
            let g: Vec<u8> = rgb.chunks_exact(3).map(|p| p[0]).collect();
            e.encode(&g, w as u16, h as u16, jpeg_encoder::ColorType::Luma).expect("encode");
        } else {
            e.set_sampling_factor(jpeg_encoder::SamplingFactor::R_4_2_0);
            e.encode(&rgb, w as u16, h as u16, jpeg_encoder::ColorType::Rgb).expect("encode");
        }
        out
    }

    fn png(w: u32, h: u32, seed: u64) -> Vec<u8> {
        let mut out = Vec::new();
        let mut e = ::png::Encoder::new(&mut out, w, h);
        e.set_color(::png::ColorType::Rgb);
        e.set_depth(::png::BitDepth::Eight);
        let mut writer = e.write_header().expect("png header");
        writer.write_image_data(&noise((w * h * 3) as usize, seed)).expect("png data");
        writer.finish().expect("png finish");
        out
    }

    #[test]
    fn kept_frames_give_the_same_bytes_as_decoding_every_epoch() {
        let files =
            [jpeg(203, 157, 1, false), jpeg(360, 376, 2, false), jpeg(501, 333, 3, false), jpeg(199, 230, 4, true), png(150, 120, 5)];
        let decode = t(Op::Decode(pb::Decode {}));
        let rrc = |size: u32| {
            t(Op::RandomResizedCrop(pb::RandomResizedCrop { size: vec![size], scale: vec![0.08, 1.0], ratio: vec![0.75, 4.0 / 3.0], ..Default::default() }))
        };
        let flip = t(Op::HorizontalFlip(pb::HorizontalFlip { p: Some(0.5) }));
        let hwc = t(Op::Layout(Layout::Hwc as i32));
        let pipelines = [
            // Random crops at DCT scales from 1 to 1/8, flipped.
            vec![decode.clone(), rrc(64), flip.clone()],
            vec![decode.clone(), rrc(24), flip.clone(), hwc.clone()],
            // A resize, then a crop of it.
            vec![decode.clone(), t(Op::Resize(pb::Resize { size: vec![80], ..Default::default() })), t(Op::CenterCrop(pb::CenterCrop { size: vec![64] }))],
            // A first pass that only crops (reads the region's edges).
            vec![decode, t(Op::CenterCrop(pb::CenterCrop { size: vec![48, 64] })), flip],
        ];
        for steps in &pipelines {
            let pipeline = Pipeline::new(steps).expect("pipeline");
            let n = files.len() as u64;
            let frames = FrameCache::new(SampleCache::create(n * SCALES, 64 << 20, None).expect("cache"), n, 3);
            let reads = Cell::new(0u32);
            for epoch in 0..3 {
                for (index, file) in files.iter().enumerate() {
                    let key = SampleKey { seed: 11, epoch, index: index as u64 };
                    let mut plain = vec![0u8; pipeline.output_bytes()];
                    pipeline.run(file, key, &mut plain).expect("plain");
                    let mut kept = vec![0u8; pipeline.output_bytes()];
                    let read = || {
                        reads.set(reads.get() + 1);
                        Ok(file.as_slice())
                    };
                    pipeline.run_kept(key, &mut kept, &frames, read).expect("kept");
                    assert!(plain == kept, "{steps:?}: sample {index} of epoch {epoch} differs with kept frames");
                }
            }
            let stats = frames.cache.stats();
            assert!(stats.hits > 0 && stats.hits + stats.misses == 3 * n, "{stats:?}");
            assert!(u64::from(reads.get()) <= stats.misses, "a hit reads no file: {} reads, {stats:?}", reads.get());
        }
    }
}
