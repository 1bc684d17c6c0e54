//! Tests of the data pipeline: determinism whatever the number of workers,
//! shuffling per epoch, drop_last, worker RNG streams, random_split.

use super::*;
use crate::random::Generator;
use kiln_ir::{DType, Error};

/// 50 samples: `[x (2 floats), y (i64)]` with x = [i, -i], y = i.
fn ds(n: usize) -> TensorDataset {
    let x: Vec<f32> = (0..n).flat_map(|i| [i as f32, -(i as f32)]).collect();
    let y: Vec<i64> = (0..n as i64).collect();
    TensorDataset::new(vec![
        Tensor::from_vec(x, &[n, 2]).unwrap(),
        Tensor::from_vec(y, &[n]).unwrap(),
    ])
    .unwrap()
}

/// Every batch of one epoch as plain numbers (all fields, flattened).
fn run(loader: &mut DataLoader) -> Vec<Vec<Vec<f64>>> {
    loader
        .iter()
        .map(|b| b.unwrap().iter().map(|t| t.to_f64_vec()).collect())
        .collect()
}

fn labels(batches: &[Vec<Vec<f64>>]) -> Vec<usize> {
    batches
        .iter()
        .flat_map(|b| b[1].iter().map(|&v| v as usize))
        .collect()
}

#[test]
fn order_and_content_do_not_depend_on_num_workers() {
    let mk = |w: usize, persistent: bool, prefetch: usize| {
        DataLoader::new(ds(50), 7)
            .shuffle(true)
            .seed(123)
            .num_workers(w)
            .prefetch_factor(prefetch)
            .persistent_workers(persistent)
    };
    let mut reference = mk(0, false, 2);
    let want: Vec<_> = (0..3).map(|_| run(&mut reference)).collect();
    for (w, persistent, prefetch) in [(1, false, 2), (3, false, 1), (3, true, 2), (2, true, 5)] {
        let mut l = mk(w, persistent, prefetch);
        for (epoch, want) in want.iter().enumerate() {
            assert_eq!(&run(&mut l), want, "workers {w} epoch {epoch}");
        }
    }
    // shapes from the default collate
    let b = reference.iter_epoch(0).next().unwrap().unwrap();
    assert_eq!((b[0].dims(), b[1].dims()), (&[7, 2][..], &[7][..]));
    assert_eq!((b[0].dtype(), b[1].dtype()), (DType::F32, DType::I64));
    let x = b[0].to_f64_vec();
    let y = b[1].to_f64_vec();
    assert!((0..7).all(|i| x[2 * i] == y[i] && x[2 * i + 1] == -y[i]));
}

#[test]
fn drop_last_and_lengths() {
    let mut l = DataLoader::new(ds(50), 8);
    assert_eq!(l.len(), 7);
    let b = run(&mut l);
    assert_eq!(b.len(), 7);
    assert_eq!(b[6][1].len(), 2);
    assert_eq!(labels(&b), (0..50).collect::<Vec<_>>()); // no shuffle: in order
    let mut l = DataLoader::new(ds(50), 8)
        .drop_last(true)
        .shuffle(true)
        .num_workers(2);
    assert_eq!(l.len(), 6);
    let it = l.iter();
    assert_eq!(it.len(), 6);
    let b: Vec<_> = it.map(|b| b.unwrap()).collect();
    assert_eq!(b.len(), 6);
    assert!(b.iter().all(|b| b[1].dims() == [8]));
}

#[test]
fn every_epoch_reshuffles_and_covers_every_sample_once() {
    let mut l = DataLoader::new(ds(40), 6).shuffle(true).seed(9);
    let e0 = labels(&run(&mut l));
    let e1 = labels(&run(&mut l));
    assert_eq!(l.epoch(), 2);
    assert_ne!(e0, e1);
    assert_ne!(e0, (0..40).collect::<Vec<_>>());
    for e in [&e0, &e1] {
        let mut s = e.clone();
        s.sort();
        assert_eq!(s, (0..40).collect::<Vec<_>>());
    }
    // any epoch can be replayed (resume from a checkpoint)
    l.set_epoch(1);
    assert_eq!(labels(&run(&mut l)), e1);
    assert_eq!(
        labels(
            &l.iter_epoch(0)
                .map(|b| { b.unwrap().iter().map(|t| t.to_f64_vec()).collect() })
                .collect::<Vec<_>>()
        ),
        e0
    );
}

#[test]
fn same_seed_same_batches_other_seed_other_batches() {
    let order = |seed: u64| {
        labels(&run(&mut DataLoader::new(ds(30), 4)
            .shuffle(true)
            .seed(seed)))
    };
    assert_eq!(order(5), order(5));
    assert_ne!(order(5), order(6));
    // a generator gives the seed: the same generator state, the same loader
    let a = DataLoader::new(ds(30), 4).generator(&mut Generator::new(77));
    let b = DataLoader::new(ds(30), 4).generator(&mut Generator::new(77));
    assert_eq!(a.initial_seed(), b.initial_seed());
    assert_eq!(a.batch_indices(3), b.batch_indices(3));
}

/// A loader whose transform appends a draw from the worker's stream and the worker id.
fn augmenting(workers: usize, per_batch: bool) -> DataLoader {
    DataLoader::new(ds(24), 4)
        .shuffle(true)
        .seed(31)
        .num_workers(workers)
        .per_batch_rng(per_batch)
        .transform(|mut s, ctx| {
            s.push(Tensor::scalar(ctx.rng.uniform_f64()));
            s.push(Tensor::scalar(ctx.id as i64));
            Ok(s)
        })
}

#[test]
fn worker_streams_differ_across_workers_and_repeat_across_runs() {
    let a = run(&mut augmenting(3, false));
    let b = run(&mut augmenting(3, false));
    assert_eq!(a, b, "the same seed repeats the augmentation");
    // batch i is loaded by worker i % 3
    for (i, batch) in a.iter().enumerate() {
        assert!(batch[3].iter().all(|&w| w as usize == i % 3));
    }
    // the first draw of each worker's stream differs across workers
    let first: Vec<f64> = a[..3].iter().map(|b| b[2][0]).collect();
    assert!(first[0] != first[1] && first[1] != first[2] && first[0] != first[2]);
    // a new epoch gives new streams
    let mut l = augmenting(3, false);
    let e0 = run(&mut l);
    let e1 = run(&mut l);
    assert_ne!(e0[0][2], e1[0][2]);
    // the order itself does not depend on the transform's draws or the workers
    assert_eq!(labels(&a), labels(&run(&mut augmenting(0, false))));
}

#[test]
fn per_batch_streams_make_augmentation_independent_of_num_workers() {
    let field =
        |b: Vec<Vec<Vec<f64>>>| -> Vec<Vec<f64>> { b.into_iter().map(|b| b[2].clone()).collect() };
    let want = field(run(&mut augmenting(0, true)));
    assert_eq!(field(run(&mut augmenting(1, true))), want);
    assert_eq!(field(run(&mut augmenting(3, true))), want);
}

#[test]
fn custom_collate_and_errors() {
    let mut l = DataLoader::new(ds(10), 3).collate(|samples| {
        let xs: Vec<&Tensor> = samples.iter().map(|s| &s[0]).collect();
        Ok(vec![Tensor::cat(&xs, 0)?]) // [6] instead of [3, 2]
    });
    let b = l.iter().next().unwrap().unwrap();
    assert_eq!(b.len(), 1);
    assert_eq!(b[0].dims(), &[6]);

    for workers in [0, 2] {
        let mut l = DataLoader::new(ds(10), 3)
            .num_workers(workers)
            .transform(|s, ctx| {
                let i = s[1].item()? as i64;
                if i == 4 {
                    return Err(Error::op("augment", "sample 4 is bad"));
                }
                if i == 8 && ctx.num_workers > 0 {
                    panic!("sample 8 exploded");
                }
                Ok(s)
            });
        let r: Vec<_> = l.iter().collect();
        assert_eq!(r.len(), 4);
        assert!(r[0].is_ok() && r[3].is_ok());
        assert!(r[1]
            .as_ref()
            .unwrap_err()
            .to_string()
            .contains("sample 4 is bad"));
        if workers > 0 {
            let e = r[2].as_ref().unwrap_err().to_string();
            assert!(
                e.contains("panicked") && e.contains("sample 8 exploded"),
                "{e}"
            );
        }
    }
    let mut l = DataLoader::new(ds(10), 0);
    let e = l.iter().next().unwrap().unwrap_err().to_string();
    assert!(e.contains("batch_size"), "{e}");
    let bad = TensorDataset::new(vec![
        Tensor::zeros(&[3], DType::F32),
        Tensor::zeros(&[4], DType::F32),
    ]);
    assert!(bad.unwrap_err().to_string().contains("[4]"));
    assert!(ds(3).get(3).is_err());
}

#[test]
fn abandoned_epochs_do_not_leak_into_the_next_one() {
    let mut l = DataLoader::new(ds(40), 4)
        .shuffle(true)
        .seed(3)
        .num_workers(2)
        .persistent_workers(true);
    let mut reference = DataLoader::new(ds(40), 4).shuffle(true).seed(3);
    let _ = run(&mut reference);
    {
        let mut it = l.iter(); // epoch 0, stopped after one batch
        it.next().unwrap().unwrap();
    }
    assert_eq!(run(&mut l), run(&mut reference)); // epoch 1
}

#[test]
fn random_split_sizes_disjoint_and_reproducible() {
    let parts = random_split(ds(50), [30, 15, 5], Some(&mut Generator::new(1))).unwrap();
    assert_eq!(
        parts.iter().map(|p| p.len()).collect::<Vec<_>>(),
        vec![30, 15, 5]
    );
    let mut all: Vec<usize> = parts.iter().flat_map(|p| p.indices.clone()).collect();
    all.sort();
    assert_eq!(all, (0..50).collect::<Vec<_>>());
    // samples come from the parent at the subset's indices
    let s = parts[1].get(2).unwrap();
    assert_eq!(s[1].item().unwrap() as usize, parts[1].indices[2]);
    let again = random_split(ds(50), [30, 15, 5], Some(&mut Generator::new(1))).unwrap();
    assert_eq!(again[0].indices, parts[0].indices);
    let other = random_split(ds(50), [30, 15, 5], Some(&mut Generator::new(2))).unwrap();
    assert_ne!(other[0].indices, parts[0].indices);
    // fractions: floor, then the remainder round-robin (PyTorch's rule)
    let f = random_split(ds(10), [0.33, 0.33, 0.34], Some(&mut Generator::new(0))).unwrap();
    assert_eq!(f.iter().map(|p| p.len()).collect::<Vec<_>>(), vec![4, 3, 3]);
    let f = random_split(ds(1797), [0.8, 0.2], Some(&mut Generator::new(0))).unwrap();
    assert_eq!((f[0].len(), f[1].len()), (1438, 359));
    assert!(random_split(ds(10), [3, 3], None)
        .unwrap_err()
        .to_string()
        .contains("10"));
    assert!(random_split(ds(10), [0.5, 0.6], None).is_err());
    // a subset feeds a loader
    let mut l = DataLoader::new(parts[2].clone(), 2);
    assert_eq!(run(&mut l).len(), 3);
}
