use super::*;
use loader_proto::pb::{self, transform::Op};

fn t(op: Op) -> Transform {
    Transform { op: Some(op) }
}
fn decode() -> Transform {
    t(Op::Decode(pb::Decode {}))
}
fn rrc(size: &[u32], scale: &[f32], ratio: &[f32]) -> Transform {
    rrc_with(size, scale, ratio, Interpolation::Unspecified as i32)
}
fn rrc_with(size: &[u32], scale: &[f32], ratio: &[f32], interpolation: i32) -> Transform {
    t(Op::RandomResizedCrop(pb::RandomResizedCrop {
        size: size.to_vec(),
        scale: scale.to_vec(),
        ratio: ratio.to_vec(),
        interpolation,
    }))
}
fn resize(size: &[u32]) -> Transform {
    resize_with(size, Interpolation::Unspecified as i32)
}
fn resize_with(size: &[u32], interpolation: i32) -> Transform {
    t(Op::Resize(pb::Resize { size: size.to_vec(), interpolation }))
}
fn center_crop(size: &[u32]) -> Transform {
    t(Op::CenterCrop(pb::CenterCrop { size: size.to_vec() }))
}
fn flip(p: Option<f32>) -> Transform {
    t(Op::HorizontalFlip(pb::HorizontalFlip { p }))
}
fn normalize(mean: &[f32], std: &[f32]) -> Transform {
    t(Op::Normalize(pb::Normalize { mean: mean.to_vec(), std: std.to_vec() }))
}
fn cast(d: i32) -> Transform {
    t(Op::Cast(pb::Cast { dtype: d }))
}
fn layout(l: i32) -> Transform {
    t(Op::Layout(l))
}

/// The field of the error a pipeline fails with.
#[track_caller]
fn fails(ts: &[Transform], field: &str) -> SpecError {
    let e = output(ts).expect_err(field);
    assert_eq!(e.field, field, "{e}");
    e
}

#[test]
fn training_pipeline_defaults_to_uint8_chw() {
    let p = check(&[decode(), rrc(&[224], &[], &[]), flip(None)]).expect("valid");
    assert_eq!(p.dtype, Dtype::U8);
    assert_eq!(p.shape(), vec![3, 224, 224]);
    assert_eq!(
        p.steps[1],
        Step::RandomResizedCrop { height: 224, width: 224, scale: DEFAULT_SCALE, ratio: DEFAULT_RATIO, filter: Filter::Bilinear }
    );
    assert_eq!(p.steps[2], Step::HorizontalFlip { p: 0.5 });
}

#[test]
fn eval_pipeline_with_normalize_is_float_and_hwc_on_request() {
    let ts = [decode(), resize(&[256]), center_crop(&[224, 200]), normalize(&[0.5; 3], &[0.25; 3]), layout(Layout::Hwc as i32)];
    assert_eq!(output(&ts).expect("valid"), (Dtype::F32, vec![224, 200, 3]));
    let ts = [decode(), resize(&[100, 120]), normalize(&[0.5; 3], &[0.25; 3]), cast(Dtype::U8 as i32)];
    assert_eq!(output(&ts).expect("valid"), (Dtype::U8, vec![3, 100, 120]));
    let ts = [decode(), center_crop(&[8]), cast(Dtype::F32 as i32)];
    assert_eq!(output(&ts).expect("valid"), (Dtype::F32, vec![3, 8, 8]));
}

#[test]
fn first_step_must_be_decode_and_only_first() {
    let e = fails(&[], "transforms");
    assert!(e.problem.contains("decode"), "{e}");
    let e = fails(&[rrc(&[224], &[], &[])], "transforms[0]");
    assert!(e.problem.contains("must be decode, got random_resized_crop"), "{e}");
    fails(&[decode(), decode(), center_crop(&[4])], "transforms[1].decode");
    fails(&[decode(), Transform { op: None }], "transforms[1]");
}

#[test]
fn sizes_hold_one_or_two_positive_values() {
    fails(&[decode(), rrc(&[], &[], &[])], "transforms[1].random_resized_crop.size");
    fails(&[decode(), rrc(&[0], &[], &[])], "transforms[1].random_resized_crop.size");
    fails(&[decode(), rrc(&[1, 2, 3], &[], &[])], "transforms[1].random_resized_crop.size");
    fails(&[decode(), rrc(&[MAX_SIDE + 1], &[], &[])], "transforms[1].random_resized_crop.size");
    fails(&[decode(), resize(&[]), center_crop(&[4])], "transforms[1].resize.size");
    fails(&[decode(), resize(&[0]), center_crop(&[4])], "transforms[1].resize.size");
    fails(&[decode(), resize(&[4, 0])], "transforms[1].resize.size");
    fails(&[decode(), center_crop(&[4, 4, 4])], "transforms[1].center_crop.size");
    fails(&[decode(), center_crop(&[0, 4])], "transforms[1].center_crop.size");
}

#[test]
fn scale_is_within_zero_one_and_ordered() {
    for bad in [&[0.0, 1.0][..], &[0.5, 1.5], &[0.9, 0.1], &[0.5], &[f32::NAN, 1.0]] {
        fails(&[decode(), rrc(&[224], bad, &[])], "transforms[1].random_resized_crop.scale");
    }
    assert!(output(&[decode(), rrc(&[224], &[1.0, 1.0], &[])]).is_ok());
}

#[test]
fn ratio_is_positive_and_ordered() {
    for bad in [&[0.0, 1.0][..], &[-1.0, 1.0], &[2.0, 1.0], &[1.0, 2.0, 3.0], &[1.0, f32::INFINITY]] {
        fails(&[decode(), rrc(&[224], &[], bad)], "transforms[1].random_resized_crop.ratio");
    }
    assert!(output(&[decode(), rrc(&[224], &[], &[1.0, 1.0])]).is_ok());
}

#[test]
fn interpolation_is_bilinear_unless_bicubic_is_asked_for() {
    let p = check(&[
        decode(),
        resize(&[256]),
        resize_with(&[300], Interpolation::Bilinear as i32),
        resize_with(&[100, 120], Interpolation::Bicubic as i32),
        rrc_with(&[64], &[], &[], Interpolation::Bicubic as i32),
    ])
    .expect("valid");
    let filters: Vec<Filter> = p
        .steps
        .iter()
        .filter_map(|s| match *s {
            Step::Resize { filter, .. } | Step::RandomResizedCrop { filter, .. } => Some(filter),
            _ => None,
        })
        .collect();
    assert_eq!(filters, [Filter::Bilinear, Filter::Bilinear, Filter::Bicubic, Filter::Bicubic]);
    assert_eq!(p.steps[3], Step::Resize { to: ResizeTo::Exact { height: 100, width: 120 }, filter: Filter::Bicubic });
    // A value from a newer peer (or garbage) is refused, naming the field.
    let e = fails(&[decode(), resize_with(&[4, 4], 3)], "transforms[1].resize.interpolation");
    assert!(e.problem.contains("bilinear or bicubic") && e.problem.contains('3'), "{e}");
    fails(&[decode(), rrc_with(&[4], &[], &[], -1)], "transforms[1].random_resized_crop.interpolation");
}

#[test]
fn flip_probability_is_within_zero_one() {
    for bad in [-0.1, 1.1, f32::NAN] {
        fails(&[decode(), flip(Some(bad)), center_crop(&[4])], "transforms[1].horizontal_flip.p");
    }
    assert!(output(&[decode(), flip(Some(0.0)), flip(Some(1.0)), center_crop(&[4])]).is_ok());
}

#[test]
fn normalize_takes_three_means_and_positive_stds() {
    let f = "transforms[2].normalize";
    fails(&[decode(), center_crop(&[4]), normalize(&[0.5; 2], &[1.0; 3])], &format!("{f}.mean"));
    fails(&[decode(), center_crop(&[4]), normalize(&[f32::NAN; 3], &[1.0; 3])], &format!("{f}.mean"));
    fails(&[decode(), center_crop(&[4]), normalize(&[0.5; 3], &[1.0; 4])], &format!("{f}.std"));
    fails(&[decode(), center_crop(&[4]), normalize(&[0.5; 3], &[1.0, 0.0, 1.0])], &format!("{f}.std"));
    fails(&[decode(), center_crop(&[4]), normalize(&[0.5; 3], &[1.0, -1.0, 1.0])], &format!("{f}.std"));
}

#[test]
fn cast_is_to_uint8_or_float32_only() {
    for bad in [Dtype::U16 as i32, Dtype::Unspecified as i32, 99] {
        let e = fails(&[decode(), center_crop(&[4]), cast(bad)], "transforms[2].cast.dtype");
        assert!(e.problem.contains("uint8 or float32"), "{e}");
    }
}

#[test]
fn layout_is_chw_or_hwc() {
    fails(&[decode(), center_crop(&[4]), layout(Layout::Unspecified as i32)], "transforms[2].layout");
    fails(&[decode(), center_crop(&[4]), layout(7)], "transforms[2].layout");
}

#[test]
fn output_size_must_be_fixed_at_the_end() {
    for ts in [
        vec![decode()],
        vec![decode(), flip(None)],
        vec![decode(), resize(&[256])],
        vec![decode(), center_crop(&[224]), resize(&[256])],
        vec![decode(), rrc(&[224], &[], &[]), resize(&[256]), flip(None)],
    ] {
        let e = fails(&ts, "transforms");
        assert!(e.problem.contains("add center_crop"), "{e}");
    }
    // A two-value resize after the last one-value resize fixes it.
    assert_eq!(output(&[decode(), resize(&[256]), resize(&[64, 32])]).expect("valid").1, vec![3, 64, 32]);
    // The last fixing step decides the size.
    assert_eq!(output(&[decode(), rrc(&[224], &[], &[]), center_crop(&[100])]).expect("valid").1, vec![3, 100, 100]);
}

#[test]
fn errors_are_one_line() {
    let e = fails(&[decode(), rrc(&[0], &[], &[])], "transforms[1].random_resized_crop.size");
    assert!(!e.to_string().contains('\n'));
    assert!(e.to_string().starts_with("invalid job spec: transforms[1].random_resized_crop.size: "), "{e}");
}
