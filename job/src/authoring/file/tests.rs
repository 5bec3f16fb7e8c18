use std::path::Path;

use loader_proto::pb::{CorruptPolicy, Dtype, HorizontalFlip, Interpolation, dataset_spec::Kind, transform::Op};

use super::values::expand_braces;
use super::*;

const YAML: &str = "
name: imagenet
dataset: {image_folder: {path: ./train}}
transforms:
  - decode
  - {random_resized_crop: {size: 224, scale: [0.25, 1.0]}}
  - horizontal_flip
  - {normalize: {mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225]}}
batch_size: 64
epochs: 2
sampler: {shuffle: true, seed: 7, drop_last: true}
on_corrupt: skip
";

fn spec_of(text: &str) -> JobSpec {
    parse(text, Path::new("/data/specs"))
        .expect("parses")
        .spec()
        .clone()
}

fn error_of(text: &str) -> String {
    let e = parse(text, Path::new("/data"))
        .expect_err("must fail")
        .to_string();
    assert!(!e.contains('\n'), "one line: {e}");
    e
}

#[test]
fn a_full_yaml_spec_becomes_the_job_spec() {
    let spec = spec_of(YAML);
    assert_eq!(spec.name, "imagenet");
    assert_eq!((spec.batch_size, spec.epochs, spec.consumers), (64, 2, 1));
    let s = spec.sampler.expect("sampler");
    assert_eq!((s.shuffle, s.seed, s.drop_last), (true, 7, true));
    assert_eq!(spec.on_corrupt, CorruptPolicy::Skip as i32);
    match spec.dataset.and_then(|d| d.kind) {
        Some(Kind::ImageFolder(f)) => assert_eq!(
            (f.path.as_str(), f.manifest.as_str()),
            ("/data/specs/train", "")
        ),
        other => panic!("dataset {other:?}"),
    }
    let ops: Vec<Op> = spec.transforms.into_iter().filter_map(|t| t.op).collect();
    assert!(matches!(ops[0], Op::Decode(_)));
    match &ops[1] {
        Op::RandomResizedCrop(c) => assert_eq!(
            (c.size.clone(), c.scale.clone(), c.ratio.clone()),
            (vec![224], vec![0.25, 1.0], vec![])
        ),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        ops[2],
        Op::HorizontalFlip(HorizontalFlip { p: None })
    ));
    assert!(matches!(&ops[3], Op::Normalize(n) if n.mean.len() == 3 && n.std.len() == 3));
}

#[test]
fn json_says_the_same_as_yaml() {
    let json = r#"{"name": "imagenet", "dataset": {"image_folder": {"path": "./train"}},
        "transforms": ["decode", {"random_resized_crop": {"size": 224, "scale": [0.25, 1.0]}}, "horizontal_flip",
                       {"normalize": {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}}],
        "batch_size": 64, "epochs": 2, "sampler": {"shuffle": true, "seed": 7, "drop_last": true}, "on_corrupt": "skip"}"#;
    assert_eq!(spec_of(json), spec_of(YAML));
    assert_eq!(
        parse_json(json, Path::new("/data/specs"))
            .expect("json")
            .spec(),
        &spec_of(YAML)
    );
}

#[test]
fn resizes_take_an_interpolation_and_leave_it_unspecified_without_one() {
    // As the Python SDK hands over a dict spec: `json.dumps(job)`.
    let json = r#"{"dataset": {"image_folder": {"path": "x"}}, "batch_size": 4,
        "transforms": ["decode", {"resize": {"size": [256], "interpolation": "bicubic"}}, {"center_crop": {"size": 224}},
                       {"random_resized_crop": {"size": 128, "interpolation": "bilinear"}},
                       {"random_resized_crop": {"size": 96, "scale": [0.5, 1.0], "interpolation": "BICUBIC"}},
                       {"resize": {"size": [64, 64]}}]}"#;
    let filters = |spec: JobSpec| -> Vec<(Vec<u32>, i32)> {
        spec.transforms
            .into_iter()
            .filter_map(|t| match t.op {
                Some(Op::Resize(r)) => Some((r.size, r.interpolation)),
                Some(Op::RandomResizedCrop(c)) => Some((c.size, c.interpolation)),
                _ => None,
            })
            .collect()
    };
    let want = vec![
        (vec![256], Interpolation::Bicubic as i32),
        (vec![128], Interpolation::Bilinear as i32),
        (vec![96], Interpolation::Bicubic as i32),
        (vec![64, 64], Interpolation::Unspecified as i32),
    ];
    assert_eq!(filters(spec_of(json)), want);
    let yaml = "dataset: {image_folder: {path: x}}\nbatch_size: 4\ntransforms: [decode, \
        {resize: {size: 256, interpolation: bicubic}}, {center_crop: {size: 224}}, \
        {random_resized_crop: {size: 128, interpolation: bilinear}}, \
        {random_resized_crop: {size: 96, scale: [0.5, 1.0], interpolation: bicubic}}, {resize: {size: [64, 64]}}]\n";
    assert_eq!(filters(spec_of(yaml)), want);
}

#[test]
fn a_parquet_dataset_takes_files_patterns_columns_and_a_block_shuffle() {
    let spec = spec_of(
        "dataset: {parquet: {files: ['part-{0..1}.parquet', '/abs/*.parquet'], columns: [x, y]}}\nsampler: {shuffle: true, block_shuffle: true}\nbatch_size: 8\n",
    );
    match spec.dataset.and_then(|d| d.kind) {
        Some(Kind::Parquet(p)) => {
            // Globs stay patterns until the submitter expands them.
            assert_eq!(p.files, vec!["/data/specs/part-0.parquet", "/data/specs/part-1.parquet", "/abs/*.parquet"]);
            assert_eq!(p.columns, vec!["x", "y"]);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(spec.sampler.map(|s| (s.shuffle, s.block_shuffle)), Some((true, true)));
    let e = error_of("dataset: {parquet: {files: a.parquet, colums: [x]}}\nbatch_size: 4\n");
    assert!(e.contains("unknown field `colums`") && !e.contains('\n'), "{e}");
}

#[test]
fn other_datasets_parse_with_their_fields() {
    let spec = spec_of("dataset: {npy: {arrays: {x: x.npy, y: /abs/y.npy}}}\nbatch_size: 8\n");
    match spec.dataset.and_then(|d| d.kind) {
        Some(Kind::Npy(n)) => {
            let got: Vec<(&str, &str)> = n
                .arrays
                .iter()
                .map(|a| (a.name.as_str(), a.path.as_str()))
                .collect();
            assert_eq!(got, vec![("x", "/data/specs/x.npy"), ("y", "/abs/y.npy")]);
        }
        other => panic!("{other:?}"),
    }
    let spec = spec_of(
        "dataset: {webdataset: {shards: 'shards/train-{08..10}.tar'}}\ntransforms: [decode, {center_crop: {size: [32, 48]}}]\nbatch_size: 8\n",
    );
    match spec.dataset.and_then(|d| d.kind) {
        Some(Kind::Webdataset(w)) => assert_eq!(
            w.shards,
            vec![
                "/data/specs/shards/train-08.tar",
                "/data/specs/shards/train-09.tar",
                "/data/specs/shards/train-10.tar",
            ]
        ),
        other => panic!("{other:?}"),
    }
    let spec = spec_of(
        "dataset: {tokens: {path: t.bin, dtype: uint16, context_length: 2048}}\nbatch_size: 8\n",
    );
    assert!(
        matches!(spec.dataset.and_then(|d| d.kind), Some(Kind::Tokens(t)) if t.dtype == Dtype::U16 as i32 && t.context_length == 2048)
    );
    let spec = spec_of(
        "dataset: {custom: {name: mine, num_samples: 10, params: {root: /x, depth: 3}}}\nbatch_size: 2\n",
    );
    assert!(
        matches!(spec.dataset.and_then(|d| d.kind), Some(Kind::Custom(c)) if c.params.get("depth").map(String::as_str) == Some("3"))
    );
}

#[test]
fn a_python_dataset_is_the_custom_dataset_the_python_worker_serves() {
    let spec = spec_of(
        "dataset: {python: {factory: 'pkg.data:make', args: {root: /x, size: [3, 4]}, num_samples: 9}}\nbatch_size: 2\n",
    );
    let Some(Kind::Custom(c)) = spec.dataset.and_then(|d| d.kind) else {
        panic!("not a custom dataset")
    };
    assert_eq!((c.name.as_str(), c.num_samples), (PYTHON_DATASET, 9));
    assert_eq!(
        c.params.get("factory").map(String::as_str),
        Some("pkg.data:make")
    );
    let args: serde_json::Value = serde_json::from_str(&c.params["args"]).expect("args are JSON");
    assert_eq!(args, serde_json::json!({"root": "/x", "size": [3, 4]}));
    let e = error_of(
        "dataset: {python: {factory: 'a:b', num_samples: 3, workers: 2}}\nbatch_size: 2\n",
    );
    assert!(e.contains("unknown field `workers`"), "{e}");
}

#[test]
fn a_pickle_file_becomes_a_blob_named_by_its_field() {
    let spec = spec_of(
        "dataset: {python: {pickle_file: ds.pkl, collate_pickle_file: /abs/c.pkl, num_samples: 9}}\nbatch_size: 2\n",
    );
    let names: Vec<(&str, &str)> = spec
        .blobs
        .iter()
        .map(|b| (b.name.as_str(), b.source.as_str()))
        .collect();
    assert_eq!(
        names,
        vec![
            (PICKLE_FILE, "/data/specs/ds.pkl"),
            (COLLATE_PICKLE_FILE, "/abs/c.pkl")
        ]
    );
    assert!(
        spec.blobs.iter().all(|b| b.sha256.is_empty()),
        "hashed when the spec is built"
    );
    match spec.dataset.and_then(|d| d.kind) {
        Some(Kind::Custom(c)) => assert!(
            c.params.is_empty(),
            "the worker adds the paths: {:?}",
            c.params
        ),
        other => panic!("{other:?}"),
    }
    let e = error_of(
        "dataset: {python: {pickle: AAAA, pickle_file: a.pkl, num_samples: 3}}\nbatch_size: 2\n",
    );
    assert_eq!(
        e,
        "spec: dataset.python: give pickle or pickle_file, not both"
    );
}

#[test]
fn native_transforms_is_the_python_sdks_and_refused_here_when_asked_for() {
    let entry = |on: bool| {
        format!("dataset: {{python: {{factory: \"m:f\", native_transforms: {on}, num_samples: 3}}}}\nbatch_size: 2\n")
    };
    parse(&entry(false), Path::new("/data")).expect("off is the Python path, accepted");
    let e = error_of(&entry(true));
    assert!(
        e.starts_with("spec: dataset.python: native_transforms is compiled by the Python SDK from a dict job spec's own python entry"),
        "{e}"
    );
    assert!(!e.contains('\n'), "{e}");
    let e = error_of(
        "dataset: {mix: {sources: [{name: a, weight: 1, dataset: {python: {factory: \"m:f\", native_transforms: true, num_samples: 3}}}]}}\nbatch_size: 2\n",
    );
    assert!(e.starts_with("spec: dataset.mix.sources[0].dataset.python: native_transforms"), "{e}");
}

#[test]
fn bad_specs_fail_on_one_line_naming_the_field() {
    let image = |transforms: &str| {
        format!("dataset: {{image_folder: {{path: x}}}}\ntransforms: {transforms}\nbatch_size: 4\n")
    };
    let cases: Vec<(String, &str)> = vec![
        (image("[decode, rotate]"), "spec: transforms[1]: unknown transform `rotate`; expected one of: decode, random_resized_crop, resize, center_crop, horizontal_flip, normalize, cast, layout"),
        (image("[decode, {random_resized_crop: {size: -5}}]"), "spec: transforms[1].random_resized_crop.size: must be a positive number of pixels, got -5"),
        (image("[decode, {resize: {size: 256, mode: nearest}}]"), "spec: transforms[1].resize: unknown field `mode`, expected `size` or `interpolation`"),
        (image("[decode, {resize: {size: 256, interpolation: nearest}}, {center_crop: {size: 224}}]"), "spec: transforms[1].resize.interpolation: unknown interpolation `nearest`; expected bilinear or bicubic"),
        (image("[decode, {random_resized_crop: {size: 224, interpolation: 2}}]"), "spec: transforms[1].random_resized_crop.interpolation: unknown interpolation `2`; expected bilinear or bicubic"),
        (image("[decode, {center_crop: {size: 224, interpolation: bicubic}}]"), "spec: transforms[1].center_crop: unknown field `interpolation`, expected `size`"),
        (image("[decode, resize]"), "spec: transforms[1]: transform `resize` needs a size, e.g. `{resize: {size: 224}}`"),
        (image("[decode, {cast: {dtype: float128}}]"), "spec: transforms[1].cast.dtype: unknown dtype `float128`"),
        (image("[]"), "spec: transforms: an image dataset needs a pipeline"),
        ("dataset: {image_folder: {path: x}}\ntransforms: [decode]\n".into(), "spec: missing field `batch_size`"),
        ("dataset: {image_folder: {}}\ntransforms: [decode]\nbatch_size: 4\n".into(), "spec: dataset.image_folder: missing field `path`"),
        ("dataset: {imagefolder: {path: x}}\ntransforms: [decode]\nbach_size: 4\n".into(), "spec: unknown field `bach_size`, expected one of"),
        ("dataset: {csv: {path: x}}\nbatch_size: 4\n".into(), "spec: dataset: unknown dataset `csv`; expected one of: image_folder, webdataset, npy, parquet, tokens, synthetic, custom"),
        ("dataset: {npy: {arrays: {x: a.npy}}}\ntransforms: [decode]\nbatch_size: 4\n".into(), "spec: transforms: only image datasets (image_folder, webdataset, parquet with an image_column) take transforms, not npy"),
        ("dataset: {npy: {arrays: {x: a.npy}}}\nbatch_size: 0\n".into(), "spec: batch_size: must be > 0"),
        ("dataset: {npy: {arrays: {x: a.npy}}}\nbatch_size: -3\n".into(), "spec: batch_size: must be > 0, got -3"),
        ("dataset: {npy: {arrays: {x: a.npy}}}\nbatch_size: 4\non_corrupt: ignore\n".into(), "spec: on_corrupt: unknown variant `ignore`, expected `fail` or `skip`"),
        ("dataset: {webdataset: {shards: 'a-{9..1}.tar'}}\ntransforms: [decode]\nbatch_size: 4\n".into(), "spec: dataset.webdataset.shards: bad shard range in `a-{9..1}.tar`"),
        (r#"{"dataset": {"npy": {"arrays": {"x": "a.npy"}}}, "batch_size": 4, "transforms": [{"rotate": {}}]}"#.into(), "spec: transforms[0]: unknown transform `rotate`"),
        (r#"{"dataset": {"npy": {"arrays": {"x": "a.npy"}}}}"#.into(), "spec: missing field `batch_size`"),
    ];
    for (text, expect) in cases {
        let e = error_of(&text);
        assert!(
            e.starts_with(expect),
            "{text:?}\n  got: {e}\n want: {expect}"
        );
    }
}

#[test]
fn spec_files_resolve_paths_next_to_themselves() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("job.yaml");
    std::fs::write(
        &file,
        "dataset: {npy: {arrays: {x: data/x.npy}}}\nbatch_size: 4\n",
    )
    .expect("write");
    let spec = parse_file(&file).expect("parse").spec().clone();
    let expect = dir.path().join("data/x.npy").display().to_string();
    assert!(
        matches!(spec.dataset.and_then(|d| d.kind), Some(Kind::Npy(n)) if n.arrays[0].path == expect)
    );
    std::fs::write(
        &file,
        "dataset: {npy: {arrays: {x: x.npy}}}\nbatch_size: 4\nepochs: 0\n",
    )
    .expect("write");
    let e = parse_file(&file).expect_err("epochs").to_string();
    assert_eq!(e, format!("{}: epochs: must be > 0", file.display()));
    let missing = dir.path().join("nope.yaml");
    let e = parse_file(&missing).expect_err("missing").to_string();
    assert!(
        e.starts_with(&format!("{}: No such file", missing.display())),
        "{e}"
    );
}

#[test]
fn brace_ranges_expand_like_webdataset() {
    assert_eq!(expand_braces("a.tar").expect("plain"), vec!["a.tar"]);
    assert_eq!(
        expand_braces("s-{0..2}.tar").expect("range"),
        vec!["s-0.tar", "s-1.tar", "s-2.tar"]
    );
    assert_eq!(
        expand_braces("s-{000998..001000}.tar").expect("padded"),
        vec!["s-000998.tar", "s-000999.tar", "s-001000.tar"]
    );
    assert!(expand_braces("s-{a..b}.tar").is_err());
    assert!(expand_braces("s-{0..99999999}.tar").is_err());
}

const MIX: &str = "
dataset:
  mix:
    sources:
      - {name: web, weight: 0.7, dataset: {tokens: {path: web.bin, dtype: uint16, context_length: 128}}}
      - name: code
        weight: 0.2
        dataset: {tokens: {path: /abs/code.bin, dtype: uint32, context_length: 256}}
      - {name: py, weight: 0.1, dataset: {python: {pickle_file: py/ds.pkl, collate_pickle_file: /abs/c.pkl, num_samples: 50}}}
    samples_per_epoch: 1000
    source_field: source
batch_size: 8
";

#[test]
fn a_mix_of_tokens_and_python_sources_parses() {
    let spec = spec_of(MIX);
    let Some(Kind::Mix(m)) = spec.dataset.as_ref().and_then(|d| d.kind.clone()) else {
        panic!("not a mixture: {:?}", spec.dataset)
    };
    let names: Vec<(&str, f64)> = m
        .sources
        .iter()
        .map(|s| (s.name.as_str(), s.weight))
        .collect();
    assert_eq!(names, vec![("web", 0.7), ("code", 0.2), ("py", 0.1)]);
    assert_eq!(
        (m.samples_per_epoch, m.source_field.as_str(), m.block),
        (1000, "source", 0)
    );
    assert!(m.stages.is_empty() && m.weights_from == 0);
    let kinds: Vec<Kind> = m
        .sources
        .iter()
        .map(|s| s.dataset.clone().and_then(|d| d.kind).expect("a dataset"))
        .collect();
    match &kinds[0] {
        Kind::Tokens(t) => assert_eq!(
            (t.path.as_str(), t.dtype, t.context_length),
            ("/data/specs/web.bin", Dtype::U16 as i32, 128)
        ),
        other => panic!("{other:?}"),
    }
    match &kinds[1] {
        Kind::Tokens(t) => assert_eq!(
            (t.path.as_str(), t.dtype, t.context_length),
            ("/abs/code.bin", Dtype::U32 as i32, 256)
        ),
        other => panic!("{other:?}"),
    }
    match &kinds[2] {
        Kind::Custom(c) => {
            assert_eq!((c.name.as_str(), c.num_samples), (PYTHON_DATASET, 50));
            assert!(c.params.is_empty(), "{:?}", c.params);
        }
        other => panic!("{other:?}"),
    }
    let blobs: Vec<(&str, &str)> = spec
        .blobs
        .iter()
        .map(|b| (b.name.as_str(), b.source.as_str()))
        .collect();
    assert_eq!(
        blobs,
        vec![
            ("py/pickle_file", "/data/specs/py/ds.pkl"),
            ("py/collate_pickle_file", "/abs/c.pkl"),
        ]
    );
    assert_eq!(blobs[0].0, format!("py/{PICKLE_FILE}"));
    // The same mixture as JSON.
    let json = r#"{"dataset": {"mix": {"sources": [
        {"name": "web", "weight": 0.7, "dataset": {"tokens": {"path": "web.bin", "dtype": "uint16", "context_length": 128}}},
        {"name": "code", "weight": 0.2, "dataset": {"tokens": {"path": "/abs/code.bin", "dtype": "uint32", "context_length": 256}}},
        {"name": "py", "weight": 0.1, "dataset": {"python": {"pickle_file": "py/ds.pkl", "collate_pickle_file": "/abs/c.pkl", "num_samples": 50}}}],
        "samples_per_epoch": 1000, "source_field": "source"}}, "batch_size": 8}"#;
    assert_eq!(spec_of(json), spec);
}

#[test]
fn bad_mixes_fail_on_one_line_naming_the_field() {
    let tokens = "{tokens: {path: t.bin, dtype: uint16, context_length: 8}}";
    let mix =
        |sources: &str| format!("dataset: {{mix: {{sources: [{sources}]}}}}\nbatch_size: 4\n");
    let cases: Vec<(String, &[&str])> = vec![
        (
            mix(&format!(
                "{{name: a, weight: 1, dataset: {tokens}}}, {{name: inner, weight: 1, dataset: {{mix: {{sources: [{{name: b, weight: 1, dataset: {tokens}}}]}}}}}}"
            )),
            &[
                "dataset.mix.sources[1].dataset",
                "a mixture cannot hold a mixture",
            ],
        ),
        (
            mix(&format!(
                "{{name: a, weight: 1, dataset: {tokens}, shuffle: true}}"
            )),
            &["dataset.mix.sources[0]", "unknown field `shuffle`"],
        ),
        (
            mix(
                "{name: a, weight: 1, dataset: {tokens: {path: t.bin, dtype: uint16, context_length: 8, stride: 4}}}",
            ),
            &["dataset.mix.sources[0].dataset.tokens: unknown field `stride`"],
        ),
        (
            mix(&format!("{{name: a, dataset: {tokens}}}")),
            &["dataset.mix.sources[0]", "missing field `weight`"],
        ),
        (
            mix(&format!("{{weight: 1, dataset: {tokens}}}")),
            &["dataset.mix.sources[0]", "missing field `name`"],
        ),
        (
            mix("{name: a, weight: 1}"),
            &["dataset.mix.sources[0]", "missing field `dataset`"],
        ),
        (
            "dataset: {mix: {}}\nbatch_size: 4\n".into(),
            &["dataset.mix", "missing field `sources`"],
        ),
        (
            mix(""),
            &["spec: dataset.mix.sources: must list at least one source"],
        ),
        (
            mix(&format!("{{name: a, weight: -1, dataset: {tokens}}}")),
            &["spec: dataset.mix.sources[0].weight: must be a finite number >= 0, got -1"],
        ),
        (
            mix(&format!(
                "{{name: a, weight: 1, dataset: {tokens}}}, {{name: a, weight: 1, dataset: {tokens}}}"
            )),
            &["spec: dataset.mix.sources[1].name: `a` names two sources"],
        ),
        (
            mix(
                "{name: a, weight: 1, dataset: {tokens: {path: t.bin, dtype: uint16, context_length: 0}}}",
            ),
            &["spec: dataset.mix.sources[0].dataset.tokens.context_length: must be > 0"],
        ),
        (
            mix(
                "{name: a, weight: 1, dataset: {python: {pickle: AAAA, pickle_file: a.pkl, num_samples: 3}}}",
            ),
            &["spec: dataset.mix.sources[0].dataset.python: give pickle or pickle_file, not both"],
        ),
    ];
    for (text, expect) in cases {
        let e = error_of(&text);
        for part in expect {
            assert!(e.contains(part), "{text:?}\n  got: {e}\n want: {part}");
        }
    }
}

#[test]
fn an_empty_path_is_named_not_taken_for_the_spec_files_folder() {
    let e = error_of(
        "dataset: {tokens: {path: '', dtype: uint16, context_length: 8}}\nbatch_size: 4\n",
    );
    assert_eq!(e, "spec: dataset.tokens.path: must name the token file");
    let e = error_of(
        "dataset: {mix: {sources: [{name: a, weight: 1, dataset: {tokens: {path: '', dtype: uint16, context_length: 8}}}]}}\nbatch_size: 4\n",
    );
    assert_eq!(
        e,
        "spec: dataset.mix.sources[0].dataset.tokens.path: must name the token file"
    );
}

#[test]
fn a_python_stream_carries_its_shard_counts_and_the_sampler_its_lanes() {
    let spec = spec_of(
        "dataset: {python: {factory: 'loader._stream:from_factory', num_samples: 9, shard_samples: [4, 0, 5]}}\nsampler: {shuffle: true, lanes: 3, shuffle_buffer: 100}\nbatch_size: 2\n",
    );
    match spec.dataset.and_then(|d| d.kind) {
        Some(Kind::Custom(c)) => assert_eq!((c.num_samples, c.shard_samples), (9, vec![4, 0, 5])),
        other => panic!("{other:?}"),
    }
    assert_eq!(spec.sampler.map(|s| (s.lanes, s.shuffle_buffer)), Some((3, 100)));
}

#[test]
fn a_shared_stream_is_true_or_its_settings_and_needs_a_name() {
    let base = "dataset: {synthetic: {num_samples: 8, shape: [2], dtype: uint8}}\nbatch_size: 4\n";
    assert_eq!(spec_of(&format!("{base}name: s\nshared: true\n")).shared, Some(loader_proto::pb::SharedStream { max_lag: 0 }));
    assert_eq!(spec_of(&format!("{base}name: s\nshared: {{max_lag: 16}}\n")).shared.map(|s| s.max_lag), Some(16));
    assert_eq!(spec_of(&format!("{base}name: s\nshared: false\n")).shared, None);
    assert_eq!(spec_of(base).shared, None);
    let e = error_of(&format!("{base}shared: true\n"));
    assert!(e.ends_with("shared: a shared stream needs a name: trainers subscribe to it by name") && !e.contains('\n'), "{e}");
}

/// Hang guard, not a performance bound: a refusal that took this long
/// would mean the text reached the parser.
const HANG_GUARD: std::time::Duration = std::time::Duration::from_secs(5);

#[test]
fn a_spec_nested_100_000_levels_deep_is_refused_before_it_is_parsed() {
    let n = 100_000;
    let base = "dataset: {synthetic: {num_samples: 8, shape: [2], dtype: uint8}}\nbatch_size: 4\n";
    let deep_yaml = format!("{base}name: {}1{}\n", "[".repeat(n), "]".repeat(n));
    let deep_block: String = format!("{base}sampler:\n") + &"- ".repeat(n) + "1\n";
    let deep_json = format!("{{\"batch_size\": 4, \"name\": {}1{}}}", "{\"a\": ".repeat(n), "}".repeat(n));
    for (label, text, json) in [("yaml", deep_yaml, false), ("yaml block", deep_block, false), ("json", deep_json, true)] {
        let started = std::time::Instant::now();
        let e = if json { parse_json(&text, Path::new("/data")) } else { parse(&text, Path::new("/data")) }
            .expect_err("too deep")
            .to_string();
        let took = started.elapsed();
        eprintln!("{label}: refused in {took:?}: {e}");
        assert!(e.contains(&format!("nested more than {MAX_DEPTH} levels deep")) && !e.contains('\n'), "{label}: {e}");
        assert!(took < HANG_GUARD, "{label}: {took:?}");
    }
    // A spec nested as deep as the limit allows still parses.
    let nested = format!("{base}name: {}1{}\n", "[".repeat(MAX_DEPTH - 2), "]".repeat(MAX_DEPTH - 2));
    assert!(error_of(&nested).contains("name: invalid type: sequence"), "reached the parser");
}

#[test]
fn a_huge_spec_and_a_long_name_are_refused_naming_the_limit() {
    let base = "dataset: {synthetic: {num_samples: 8, shape: [2], dtype: uint8}}\nbatch_size: 4\n";
    let e = error_of(&format!("{base}name: {}\n", "n".repeat(100_000)));
    assert_eq!(e, "spec: name: 100000 bytes is longer than the 255 a job name may have");
    assert_eq!(spec_of(&format!("{base}name: {}\n", "n".repeat(255))).name.len(), 255);
    let e = error_of(&format!("{base}# {}\n", "x".repeat(MAX_SPEC_BYTES)));
    assert!(e.contains(&format!("more than the {MAX_SPEC_BYTES} a spec may have")), "{e}");

    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("huge.yaml");
    std::fs::write(&path, format!("{base}# {}\n", "x".repeat(2 * MAX_SPEC_BYTES))).expect("write");
    let e = parse_file(&path).expect_err("huge").to_string();
    assert!(e.starts_with(&format!("{}: {} bytes or more", path.display(), MAX_SPEC_BYTES + 1)), "{e}");
}
