use loader_proto::pb::{self, transform::Op};
use proptest::prelude::*;

use super::draws::random_crop;
use super::geometry::{Pass, Plan};
use super::rng::StepRng;
use super::*;

fn t(op: Op) -> Transform {
    Transform { op: Some(op) }
}
fn decode() -> Transform {
    t(Op::Decode(pb::Decode {}))
}
fn rrc(size: u32, scale: [f32; 2], ratio: [f32; 2]) -> Transform {
    t(Op::RandomResizedCrop(pb::RandomResizedCrop { size: vec![size], scale: scale.to_vec(), ratio: ratio.to_vec(), ..Default::default() }))
}
fn resize(size: &[u32]) -> Transform {
    t(Op::Resize(pb::Resize { size: size.to_vec(), ..Default::default() }))
}
fn bicubic(size: &[u32]) -> Transform {
    t(Op::Resize(pb::Resize { size: size.to_vec(), interpolation: pb::Interpolation::Bicubic as i32 }))
}
fn center_crop(size: &[u32]) -> Transform {
    t(Op::CenterCrop(pb::CenterCrop { size: size.to_vec() }))
}
fn flip(p: f32) -> Transform {
    t(Op::HorizontalFlip(pb::HorizontalFlip { p: Some(p) }))
}
fn hwc() -> Transform {
    t(Op::Layout(Layout::Hwc as i32))
}
fn key(index: u64) -> SampleKey {
    SampleKey { seed: 7, epoch: 0, index }
}

/// An RGB test picture: gradients plus a texture, so crops and flips show.
fn picture(w: u32, h: u32) -> Vec<u8> {
    let mut v = Vec::with_capacity((w * h * 3) as usize);
    for y in 0..h {
        for x in 0..w {
            let tex = ((x * 7 + y * 13) % 32) as u8;
            v.extend_from_slice(&[(x * 255 / w) as u8, (y * 255 / h) as u8, tex.wrapping_mul(8)]);
        }
    }
    v
}

fn png_of(rgb: &[u8], w: u32, h: u32) -> Vec<u8> {
    let mut out = Vec::new();
    let mut e = ::png::Encoder::new(&mut out, w, h);
    e.set_color(::png::ColorType::Rgb);
    e.set_depth(::png::BitDepth::Eight);
    let mut writer = e.write_header().expect("png header");
    writer.write_image_data(rgb).expect("png data");
    writer.finish().expect("png finish");
    out
}

fn jpeg_of(rgb: &[u8], w: u32, h: u32) -> Vec<u8> {
    let mut out = Vec::new();
    let e = jpeg_encoder::Encoder::new(&mut out, 90);
    e.encode(rgb, w as u16, h as u16, jpeg_encoder::ColorType::Rgb).expect("jpeg encode");
    out
}

fn run(steps: &[Transform], encoded: &[u8], k: SampleKey) -> Vec<u8> {
    let p = Pipeline::new(steps).expect("valid pipeline");
    let mut out = vec![0u8; p.output_bytes()];
    p.run(encoded, k, &mut out).expect("run");
    out
}

#[test]
fn output_describes_the_tensor() {
    let p = Pipeline::new(&[decode(), rrc(224, [0.08, 1.0], [0.75, 4.0 / 3.0])]).expect("valid");
    assert_eq!(p.output(), (Dtype::U8, &[3u64, 224, 224][..]));
    assert_eq!(p.output_bytes(), 3 * 224 * 224);
    let norm = t(Op::Normalize(pb::Normalize { mean: vec![0.5; 3], std: vec![0.5; 3] }));
    let p = Pipeline::new(&[decode(), center_crop(&[4, 6]), norm, hwc()]).expect("valid");
    assert_eq!(p.output(), (Dtype::F32, &[4u64, 6, 3][..]));
    assert_eq!(p.output_bytes(), 4 * 6 * 3 * 4);
    assert!(Pipeline::new(&[decode()]).is_err());
}

#[test]
fn same_key_same_pixels_on_any_thread() {
    let jpg = jpeg_of(&picture(320, 240), 320, 240);
    let steps = [decode(), rrc(64, [0.08, 1.0], [0.75, 4.0 / 3.0]), flip(0.5)];
    let here = run(&steps, &jpg, key(3));
    assert_eq!(here, run(&steps, &jpg, key(3)));
    let there = std::thread::scope(|s| s.spawn(|| run(&steps, &jpg, key(3))).join().expect("thread"));
    assert_eq!(here, there);
}

#[test]
fn different_keys_draw_different_crops() {
    let jpg = jpeg_of(&picture(320, 240), 320, 240);
    let steps = [decode(), rrc(32, [0.08, 1.0], [0.75, 4.0 / 3.0]), flip(0.5)];
    let base = run(&steps, &jpg, key(0));
    for k in [key(1), SampleKey { epoch: 1, ..key(0) }, SampleKey { seed: 8, ..key(0) }] {
        assert_ne!(base, run(&steps, &jpg, k), "{k:?}");
    }
}

#[test]
fn step_streams_are_independent_and_spread() {
    let mut a = StepRng::new(key(0), 1);
    let mut b = StepRng::new(key(0), 2);
    assert_ne!(a.unit(), b.unit());
    // Swapping epoch and index gives another stream.
    let mut c = StepRng::new(SampleKey { seed: 7, epoch: 5, index: 9 }, 1);
    let mut d = StepRng::new(SampleKey { seed: 7, epoch: 9, index: 5 }, 1);
    assert_ne!(c.unit(), d.unit());
    let mut r = StepRng::new(key(0), 0);
    let mean = (0..10_000).map(|_| r.unit()).sum::<f64>() / 10_000.0;
    assert!((mean - 0.5).abs() < 0.02, "{mean}");
    assert!((0..1000).all(|_| r.up_to(5) <= 5));
}

#[test]
fn flip_mirrors_and_p_zero_keeps() {
    let (w, h) = (9, 5);
    let rgb = picture(w, h);
    let png = png_of(&rgb, w, h);
    let keep = run(&[decode(), center_crop(&[h, w]), flip(0.0), hwc()], &png, key(0));
    assert_eq!(keep, rgb);
    let mirrored = run(&[decode(), center_crop(&[h, w]), flip(1.0), hwc()], &png, key(0));
    for y in 0..h as usize {
        for x in 0..w as usize {
            let a = &mirrored[(y * w as usize + x) * 3..][..3];
            let b = &rgb[(y * w as usize + (w as usize - 1 - x)) * 3..][..3];
            assert_eq!(a, b, "pixel ({x}, {y})");
        }
    }
    // Two flips cancel.
    assert_eq!(run(&[decode(), flip(1.0), center_crop(&[h, w]), flip(1.0), hwc()], &png, key(0)), rgb);
}

#[test]
fn center_crop_offsets_follow_torchvision() {
    let (w, h) = (10, 7);
    let rgb = picture(w, h);
    let png = png_of(&rgb, w, h);
    // (10 - 3) / 2 = 3.5 rounds to 4 (ties to even); (7 - 2) / 2 = 2.5 rounds to 2.
    let out = run(&[decode(), center_crop(&[2, 3]), hwc()], &png, key(0));
    for y in 0..2usize {
        for x in 0..3usize {
            assert_eq!(&out[(y * 3 + x) * 3..][..3], &rgb[((y + 2) * 10 + x + 4) * 3..][..3]);
        }
    }
}

#[test]
fn center_crop_larger_than_image_pads_with_zero() {
    let (w, h) = (3, 2);
    let rgb = picture(w, h);
    let png = png_of(&rgb, w, h);
    // 3 -> 6 columns: 1 left, 2 right; 2 -> 3 rows: 0 above, 1 below.
    let out = run(&[decode(), center_crop(&[3, 6]), hwc()], &png, key(0));
    for y in 0..3usize {
        for x in 0..6usize {
            let got = &out[(y * 6 + x) * 3..][..3];
            if (1..4).contains(&x) && y < 2 {
                assert_eq!(got, &rgb[(y * 3 + x - 1) * 3..][..3]);
            } else {
                assert_eq!(got, &[0, 0, 0], "({x}, {y})");
            }
        }
    }
}

#[test]
fn chw_is_the_transpose_of_hwc() {
    let rgb = picture(6, 4);
    let png = png_of(&rgb, 6, 4);
    let chw = run(&[decode(), center_crop(&[4, 6])], &png, key(0));
    for c in 0..3 {
        for i in 0..24 {
            assert_eq!(chw[c * 24 + i], rgb[i * 3 + c]);
        }
    }
}

#[test]
fn resize_keeps_flat_colour_and_sets_the_shorter_side() {
    let rgb: Vec<u8> = std::iter::repeat_n([200u8, 100, 50], 120 * 80).flatten().collect();
    let png = png_of(&rgb, 120, 80);
    let p = Pipeline::new(&[decode(), resize(&[40]), center_crop(&[40, 60]), hwc()]).expect("valid");
    let mut out = vec![0; p.output_bytes()];
    p.run(&png, key(0), &mut out).expect("run");
    assert!(out.chunks_exact(3).all(|px| px == [200, 100, 50]));
    // A one-value resize truncates the longer side: 80 -> 33 makes 120 -> 49.
    let plan = Plan::new(Pipeline::new(&[decode(), resize(&[33]), center_crop(&[1])]).expect("valid").steps(), 120, 80, key(0));
    assert_eq!(plan.passes[0].canvas, (1, 1));
    assert_eq!(geometry::resized((120, 80), loader_job::transforms::ResizeTo::ShorterSide(33)), (49, 33));
}

#[test]
fn normalize_and_cast_give_torchvision_values() {
    let rgb = picture(4, 4);
    let png = png_of(&rgb, 4, 4);
    let mean = [0.485f32, 0.456, 0.406];
    let std = [0.229f32, 0.224, 0.225];
    let norm = t(Op::Normalize(pb::Normalize { mean: mean.to_vec(), std: std.to_vec() }));
    let out = run(&[decode(), center_crop(&[4]), norm, hwc()], &png, key(0));
    for (i, v) in out.chunks_exact(4).enumerate() {
        let got = f32::from_le_bytes([v[0], v[1], v[2], v[3]]);
        let c = i % 3;
        assert_eq!(got, (f32::from(rgb[i]) / 255.0 - mean[c]) / std[c]);
    }
    let cast = t(Op::Cast(pb::Cast { dtype: Dtype::F32 as i32 }));
    let out = run(&[decode(), center_crop(&[4]), cast, hwc()], &png, key(0));
    for (i, v) in out.chunks_exact(4).enumerate() {
        assert_eq!(f32::from_le_bytes([v[0], v[1], v[2], v[3]]), f32::from(rgb[i]));
    }
}

#[test]
fn random_crop_follows_torchvision_bounds_and_fallback() {
    let mut rng = StepRng::new(key(0), 1);
    for _ in 0..1000 {
        let (x, y, w, h) = random_crop(500, 375, [0.08, 1.0], [0.75, 4.0 / 3.0], &mut rng);
        assert!(x + w <= 500 && y + h <= 375 && w > 0 && h > 0);
        let area = f64::from(w * h) / (500.0 * 375.0);
        assert!((0.07..=1.0).contains(&area), "{area}");
    }
    // No box of ratio 4..5 at full area fits a square: centre crop, ratio clamped to 4.
    assert_eq!(random_crop(100, 100, [1.0, 1.0], [4.0, 5.0], &mut rng), (0, 37, 100, 25));
    assert_eq!(random_crop(100, 100, [1.0, 1.0], [0.1, 0.2], &mut rng), (40, 0, 20, 100));
}

#[test]
fn crop_then_flip_mirrors_the_box() {
    // A flip before a crop: the crop is taken from the mirrored image.
    let (w, h) = (8, 3);
    let rgb = picture(w, h);
    let png = png_of(&rgb, w, h);
    let out = run(&[decode(), flip(1.0), center_crop(&[3, 3]), hwc()], &png, key(0));
    // Mirrored columns 2..5 (round(2.5) = 2) are original columns 5, 4, 3.
    for y in 0..3usize {
        for x in 0..3usize {
            assert_eq!(&out[(y * 3 + x) * 3..][..3], &rgb[(y * 8 + 5 - x) * 3..][..3]);
        }
    }
}

#[test]
fn dct_scale_needs_a_twofold_shrink() {
    let steps = Pipeline::new(&[decode(), rrc(64, [1.0, 1.0], [1.0, 1.0])]).expect("valid");
    let scale = |side: u32| region::dct_scale(&Plan::new(steps.steps(), side, side, key(0)).passes[0]);
    assert_eq!(scale(100), 8);
    assert_eq!(scale(127), 8);
    assert_eq!(scale(128), 4);
    assert_eq!(scale(300), 2);
    assert_eq!(scale(512), 1);
    let crop_only = Plan::new(Pipeline::new(&[decode(), center_crop(&[16])]).expect("valid").steps(), 512, 512, key(0));
    assert_eq!(region::dct_scale(&crop_only.passes[0]), 8);
}

#[test]
fn reduced_dct_decode_stays_close_to_full_decode() {
    // A smooth picture decoded at 1/4 then resized must look like the full
    // decode resized: the DCT scaling is a resampler too.
    let (w, h) = (512u32, 384u32);
    let smooth: Vec<u8> =
        (0..h).flat_map(|y| (0..w).flat_map(move |x| [(x / 2) as u8, (y / 2) as u8, ((x + y) / 4) as u8])).collect();
    let jpg = jpeg_of(&smooth, w, h);
    let png = png_of(&smooth, w, h);
    let steps = [decode(), resize(&[64, 64]), hwc()];
    let a = run(&steps, &jpg, key(0));
    let b = run(&steps, &png, key(0));
    let max = a.iter().zip(&b).map(|(x, y)| x.abs_diff(*y)).max().unwrap_or(0);
    assert!(max <= 6, "max abs diff {max}");
}

/// A noisy RGB picture: neighbouring pixels differ, so chroma upsampling
/// at a crop's edge shows.
fn noise(w: u32, h: u32, seed: u64) -> Vec<u8> {
    let mut state = seed;
    (0..w * h * 3)
        .map(|_| {
            state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            (state >> 56) as u8
        })
        .collect()
}

#[test]
fn region_decode_matches_full_decode() {
    // Every pixel of a region equals the whole image's decode, at every
    // DCT scale, edges included (a 4:2:0 JPEG: the cropped decode's edge
    // columns differ without the widening in `jpeg::decode`).
    // Also: `jpeg::held` tells each region's columns without decoding
    // (what the sample cache cuts out of a whole decode).
    use jpeg_encoder::SamplingFactor as S;
    let kinds = [(203u32, 157u32, 1u64, Some(S::R_4_2_0)), (360, 376, 2, Some(S::R_4_2_0)), (64, 48, 3, Some(S::R_4_2_0)),
        (301, 207, 4, Some(S::R_4_4_4)), (250, 190, 5, Some(S::R_4_2_2)), (199, 230, 6, None)];
    for (w, h, seed, sampling) in kinds {
        let rgb: Vec<u8> = picture(w, h).iter().zip(noise(w, h, seed)).map(|(p, n)| p / 2 + n / 2).collect();
        let mut jpg = Vec::new();
        let mut e = jpeg_encoder::Encoder::new(&mut jpg, 90);
        match sampling {
            Some(f) => {
                e.set_sampling_factor(f);
                e.encode(&rgb, w as u16, h as u16, jpeg_encoder::ColorType::Rgb).expect("jpeg encode");
            }
            None => {
                let grey: Vec<u8> = rgb.chunks_exact(3).map(|p| p[1]).collect();
                e.encode(&grey, w as u16, h as u16, jpeg_encoder::ColorType::Luma).expect("jpeg encode");
            }
        }
        let mut pick = StepRng::new(SampleKey { seed, epoch: 0, index: 0 }, 0);
        for scale in [8u32, 4, 2, 1] {
            let (sw, sh) = jpeg::scaled((w, h), scale);
            let mut full = Vec::new();
            let all = jpeg::decode(&jpg, (w, h), scale, geometry::Rect { x: 0, y: 0, w: sw, h: sh }, &mut full).expect("full");
            assert_eq!((all.origin, all.size), ((0, 0), (sw, sh)));
            for _ in 0..40 {
                let x = pick.up_to(sw - 1);
                let y = pick.up_to(sh - 1);
                let r = geometry::Rect { x, y, w: 1 + pick.up_to(sw - x - 1), h: 1 + pick.up_to(sh - y - 1) };
                let mut part = Vec::new();
                let got = jpeg::decode(&jpg, (w, h), scale, r, &mut part).expect("region");
                assert!(got.origin.0 <= r.x && got.origin.0 + got.size.0 >= r.x + r.w, "{got:?} for {r:?}");
                assert_eq!(jpeg::held(r, (sw, sh), got.align), (got.origin, got.size), "{r:?} at 1/{}", 8 / scale);
                assert_eq!((got.origin.1, got.size.1), (r.y, r.h));
                for row in 0..r.h {
                    let at = ((row * got.size.0 + r.x - got.origin.0) * 4) as usize;
                    let a = &part[at..at + r.w as usize * 4];
                    let from = (((r.y + row) * sw + r.x) * 4) as usize;
                    let b = &full[from..from + r.w as usize * 4];
                    assert!(a == b, "{w}x{h} at 1/{}: row {} of {r:?} differs", 8 / scale, r.y + row);
                }
            }
        }
    }
}

#[test]
fn grey_and_cmyk_jpegs_become_rgb() {
    let grey: Vec<u8> = (0..64u32 * 48).map(|i| (i % 251) as u8).collect();
    let mut jpg = Vec::new();
    jpeg_encoder::Encoder::new(&mut jpg, 95).encode(&grey, 64, 48, jpeg_encoder::ColorType::Luma).expect("encode");
    let out = run(&[decode(), center_crop(&[48, 64]), hwc()], &jpg, key(0));
    assert!(out.chunks_exact(3).all(|p| p[0] == p[1] && p[1] == p[2]));
    let cmyk: Vec<u8> = std::iter::repeat_n([0u8, 255, 255, 0], 16 * 16).flatten().collect();
    let mut jpg = Vec::new();
    jpeg_encoder::Encoder::new(&mut jpg, 95).encode(&cmyk, 16, 16, jpeg_encoder::ColorType::Cmyk).expect("encode");
    let out = run(&[decode(), center_crop(&[16]), hwc()], &jpg, key(0));
    // Cyan-free, full magenta and yellow, no black: red.
    assert!(out.chunks_exact(3).all(|p| p[0] > 200 && p[1] < 50 && p[2] < 50), "{:?}", &out[..3]);
}

#[test]
fn corrupt_bytes_are_errors_not_panics() {
    let steps = [decode(), rrc(32, [0.08, 1.0], [0.75, 4.0 / 3.0])];
    let p = Pipeline::new(&steps).expect("valid");
    let mut out = vec![0; p.output_bytes()];
    let jpg = jpeg_of(&picture(64, 64), 64, 64);
    let png = png_of(&picture(64, 64), 64, 64);
    for bad in [&b""[..], b"hello", &[0xFF, 0xD8, 0xFF], &jpg[..jpg.len() / 2], &png[..png.len() / 2], &png[..20]] {
        match p.run(bad, key(0), &mut out) {
            Err(ImageError::Corrupt(reason)) => assert!(!reason.contains('\n'), "{reason}"),
            other => panic!("{other:?} for {} bytes", bad.len()),
        }
    }
    assert!(matches!(p.run(&jpg, key(0), &mut [0u8; 3]), Err(ImageError::OutputSize { .. })));
}

#[test]
fn plans_fold_a_crop_after_a_resize_into_one_pass() {
    let steps = Pipeline::new(&[decode(), resize(&[256]), center_crop(&[224])]).expect("valid");
    let plan = Plan::new(steps.steps(), 500, 375, key(0));
    assert_eq!(plan.passes.len(), 1);
    let Pass { canvas, src, .. } = &plan.passes[0];
    assert_eq!(*canvas, (224, 224));
    // 375 -> 256: the box is the crop's pre-image.
    assert!((src.h - 224.0 * 375.0 / 256.0).abs() < 1e-9, "{src:?}");
    // A resize after a resize needs a second pass.
    let steps = Pipeline::new(&[decode(), resize(&[256]), resize(&[100, 100])]).expect("valid");
    assert_eq!(Plan::new(steps.steps(), 500, 375, key(0)).passes.len(), 2);
}

#[test]
fn each_pass_resamples_with_the_filter_of_its_resize() {
    use loader_job::transforms::Filter::{self, Bicubic, Bilinear};
    let filters = |steps: &[Transform]| -> Vec<Filter> {
        let p = Pipeline::new(steps).expect("valid");
        Plan::new(p.steps(), 500, 375, key(0)).passes.iter().map(|p| p.filter).collect()
    };
    // A crop after the resize, or before it, folds in and keeps its filter.
    assert_eq!(filters(&[decode(), bicubic(&[256]), center_crop(&[224])]), [Bicubic]);
    assert_eq!(filters(&[decode(), center_crop(&[300]), bicubic(&[100, 100])]), [Bicubic]);
    assert_eq!(filters(&[decode(), resize(&[256]), center_crop(&[224])]), [Bilinear]);
    let crop = t(Op::RandomResizedCrop(pb::RandomResizedCrop {
        size: vec![64],
        interpolation: pb::Interpolation::Bicubic as i32,
        ..Default::default()
    }));
    assert_eq!(filters(&[decode(), crop, flip(0.5)]), [Bicubic]);
    // A second resize is a second pass, with its own filter.
    assert_eq!(filters(&[decode(), bicubic(&[256]), resize(&[100, 100])]), [Bicubic, Bilinear]);
    assert_eq!(filters(&[decode(), resize(&[256]), bicubic(&[100, 100])]), [Bilinear, Bicubic]);
}

#[test]
fn a_region_decode_reads_as_far_as_either_filter_reaches() {
    // The JPEG's region decode against its whole decode at the same DCT
    // scale (as a PNG, which is always decoded whole): the same bytes only
    // if the region holds every pixel the filter gives a weight. Bicubic
    // reaches twice as far as bilinear; the region's margin hides the
    // difference until the pass after the DCT scaling still shrinks a lot,
    // as a 64x shrink does (1/8, then 8x).
    let (w, h) = (1600u32, 1280u32);
    let rgb: Vec<u8> = picture(w, h).iter().zip(noise(w, h, 9)).map(|(p, n)| p / 2 + n / 2).collect();
    let jpg = jpeg_of(&rgb, w, h);
    let mut whole = Vec::new();
    let (sw, sh) = jpeg::scaled((w, h), 1);
    jpeg::decode(&jpg, (w, h), 1, geometry::Rect { x: 0, y: 0, w: sw, h: sh }, &mut whole).expect("decode");
    let decoded: Vec<u8> = whole.chunks_exact(PIXEL).flat_map(|p| [p[0], p[1], p[2]]).collect();
    let png = png_of(&decoded, sw, sh);
    for steps in [
        [decode(), bicubic(&[20]), center_crop(&[8, 10]), hwc()],
        [decode(), resize(&[20]), center_crop(&[8, 10]), hwc()],
    ] {
        let plan = Plan::new(Pipeline::new(&steps).expect("valid").steps(), w, h, key(0));
        assert_eq!(region::dct_scale(&plan.passes[0]), 1);
        assert_eq!(run(&steps, &jpg, key(0)), run(&steps, &png, key(0)));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(mut bytes in proptest::collection::vec(any::<u8>(), 0..2048), kind in 0u8..3) {
        match kind {
            0 => bytes.splice(0..0, [0xFF, 0xD8, 0xFF]).for_each(drop),
            1 => bytes.splice(0..0, *b"\x89PNG\r\n\x1a\n").for_each(drop),
            _ => {}
        }
        let p = Pipeline::new(&[decode(), rrc(16, [0.08, 1.0], [0.75, 4.0 / 3.0]), flip(0.5)]).expect("valid");
        let mut out = vec![0; p.output_bytes()];
        let _ = p.run(&bytes, key(0), &mut out);
    }

    #[test]
    fn damaged_images_never_panic(at in 0usize..4096, value in any::<u8>(), cut in 0usize..4096, png in any::<bool>()) {
        let rgb = picture(48, 40);
        let mut bytes = if png { png_of(&rgb, 48, 40) } else { jpeg_of(&rgb, 48, 40) };
        let n = bytes.len();
        bytes[at % n] = value;
        bytes.truncate(n - cut % (n / 2));
        let p = Pipeline::new(&[decode(), resize(&[20]), center_crop(&[16]), flip(0.5)]).expect("valid");
        let mut out = vec![0; p.output_bytes()];
        let _ = p.run(&bytes, key(0), &mut out);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// The vectorized CHW write (SSE2 on x86_64) against a plain reference,
    /// at widths around its 16-pixel blocks.
    #[test]
    fn chw_write_matches_reference(w in 1usize..70, h in 1usize..4, flip in any::<bool>(), seed in any::<u8>()) {
        let canvas: Vec<u8> = (0..w * h * PIXEL).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect();
        let mut out = vec![0u8; w * h * 3];
        emit::write(&canvas, w, h, flip, Layout::Chw, &emit::Values::Identity, &mut out);
        for c in 0..3 {
            for y in 0..h {
                for x in 0..w {
                    let sx = if flip { w - 1 - x } else { x };
                    prop_assert_eq!(out[c * w * h + y * w + x], canvas[(y * w + sx) * PIXEL + c]);
                }
            }
        }
    }
}
