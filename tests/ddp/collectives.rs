//! The rank checks of the collectives themselves, the sampler and
//! SyncBatchNorm (DDP's own checks stay in `ranks.rs`).

use super::*;

pub(super) fn collectives() -> std::result::Result<(), String> {
    let r = dist::rank() as f32;
    assert_eq!(dist::world_size(), 2);
    // rank 0: [1, 10, 0], rank 1: [2, 20, -1]
    let mk = || f32s(&[r + 1.0, 10.0 * (r + 1.0), -r], &[3]);
    for (op, want) in [
        (ReduceOp::Sum, [3.0, 30.0, -1.0]),
        (ReduceOp::Avg, [1.5, 15.0, -0.5]),
        (ReduceOp::Max, [2.0, 20.0, 0.0]),
        (ReduceOp::Min, [1.0, 10.0, -1.0]),
    ] {
        let t = mk();
        dist::all_reduce(&t, op).map_err(e)?;
        close(&format!("all_reduce {op:?}"), &t.to_f64_vec(), &want, 0.0)?;
    }
    // f64, i64 and f16 (reduced in f32) keep their dtype
    let t = Tensor::from_vec(vec![0.25f64 * (r as f64 + 1.0)], &[1]).map_err(e)?;
    dist::all_reduce(&t, ReduceOp::Sum).map_err(e)?;
    close("f64 sum", &t.to_f64_vec(), &[0.75], 0.0)?;
    let t = Tensor::from_vec(vec![5i64 + r as i64, -(r as i64)], &[2]).map_err(e)?;
    dist::all_reduce(&t, ReduceOp::Max).map_err(e)?;
    if t.to_vec::<i64>().map_err(e)? != vec![6, 0] {
        return Err(format!("i64 max: {:?}", t.to_f64_vec()));
    }
    let t = f32s(&[1.5 + r], &[1]).to_dtype(DType::F16).map_err(e)?;
    dist::all_reduce(&t, ReduceOp::Sum).map_err(e)?;
    if t.dtype() != DType::F16 {
        return Err("f16 all_reduce changed the dtype".into());
    }
    close("f16 sum", &t.to_f64_vec(), &[4.0], 0.0)?;
    // broadcast from rank 1: [7, 8] on rank 1 reaches rank 0
    let t = f32s(&[3.0 + 4.0 * r, 4.0 + 4.0 * r], &[2]);
    dist::broadcast(&t, 1).map_err(e)?;
    close("broadcast", &t.to_f64_vec(), &[7.0, 8.0], 0.0)?;
    // all_gather: each rank's [r, r*r+1] in rank order
    let g = dist::all_gather(&f32s(&[r, r * r + 1.0], &[2])).map_err(e)?;
    let got: Vec<f64> = g.iter().flat_map(|t| t.to_f64_vec()).collect();
    close("all_gather", &got, &[0.0, 1.0, 1.0, 2.0], 0.0)?;
    if g.iter().any(|t| t.dims() != [2]) {
        return Err("all_gather shapes".into());
    }
    // reduce_scatter: input [4,1] = (rank+1) * [1,2,3,4]; rank 0 gets rows 0-1 summed
    let x = f32s(&[1.0, 2.0, 3.0, 4.0], &[4, 1])
        .mul(&Tensor::scalar(r + 1.0))
        .map_err(e)?;
    let y = dist::reduce_scatter(&x, ReduceOp::Sum).map_err(e)?;
    let want = if r == 0.0 { [3.0, 6.0] } else { [9.0, 12.0] };
    close("reduce_scatter", &y.to_f64_vec(), &want, 0.0)?;
    if y.dims() != [2, 1] {
        return Err(format!("reduce_scatter dims {:?}", y.dims()));
    }
    // async: two in flight, waited out of order
    let a = f32s(&[1.0], &[1]);
    let b = f32s(&[r], &[1]);
    let wa = dist::all_reduce_async(&a, ReduceOp::Sum).map_err(e)?;
    let wb = dist::all_reduce_async(&b, ReduceOp::Max).map_err(e)?;
    wb.wait().map_err(e)?;
    wa.wait().map_err(e)?;
    close(
        "async",
        &[a.item().map_err(e)?, b.item().map_err(e)?],
        &[2.0, 1.0],
        0.0,
    )?;
    let w = dist::all_gather_async(&f32s(&[10.0 * r], &[1])).map_err(e)?;
    let got: Vec<f64> = w
        .wait()
        .map_err(e)?
        .iter()
        .map(|t| t.item().unwrap())
        .collect();
    close("all_gather_async", &got, &[0.0, 10.0], 0.0)?;
    dist::barrier().map_err(e)?;
    if dist::local_rank() != dist::rank() {
        return Err("local rank on one host".into());
    }
    Ok(())
}

pub(super) fn collective_errors() -> std::result::Result<(), String> {
    let x = Tensor::zeros(&[3, 2], DType::F32);
    let m = dist::reduce_scatter(&x, ReduceOp::Sum)
        .err()
        .ok_or("reduce_scatter of 3 rows over 2 ranks succeeded")?
        .to_string();
    if !m.contains("reduce_scatter") || !m.contains("[3,2]") {
        return Err(m);
    }
    let m = dist::broadcast(&x, 5)
        .err()
        .ok_or("broadcast from rank 5")?
        .to_string();
    if !m.contains("rank 5 is out of range") {
        return Err(m);
    }
    let m = dist::all_reduce(&Tensor::zeros(&[2], DType::I64), ReduceOp::Avg)
        .err()
        .ok_or("integer avg")?
        .to_string();
    if !m.contains("Avg") {
        return Err(m);
    }
    let m = dist::init_process_group(Backend::Mpi)
        .err()
        .ok_or("second init")?
        .to_string();
    if !m.contains("exists already") {
        return Err(m);
    }
    // the group still works after refused calls
    let t = Tensor::ones(&[1], DType::F32);
    dist::all_reduce(&t, ReduceOp::Sum).map_err(e)?;
    close("after errors", &t.to_f64_vec(), &[2.0], 0.0)
}

pub(super) fn sampler() -> std::result::Result<(), String> {
    for (n, drop_last) in [(1438usize, false), (7, false), (7, true)] {
        let mut s = DistributedSampler::new(n).seed(3).drop_last(drop_last);
        s.set_epoch(2);
        let mine: Vec<i64> = s.indices().iter().map(|&i| i as i64).collect();
        let t = Tensor::from_vec(mine.clone(), &[mine.len()]).map_err(e)?;
        let all = dist::all_gather(&t).map_err(e)?;
        let (a, b) = (
            all[0].to_vec::<i64>().map_err(e)?,
            all[1].to_vec::<i64>().map_err(e)?,
        );
        let mut u: Vec<i64> = a.iter().chain(&b).copied().collect();
        u.sort();
        let before = u.len();
        u.dedup();
        let want_len = if drop_last { n / 2 * 2 } else { n };
        if u.len() != want_len || (!drop_last && u != (0..n as i64).collect::<Vec<_>>()) {
            return Err(format!("n {n}: shards {a:?} / {b:?} do not cover"));
        }
        let pad = if drop_last { 0 } else { n.div_ceil(2) * 2 - n };
        if before - u.len() != pad {
            return Err(format!(
                "n {n}: {} repeats, expected the padding {pad}",
                before - u.len()
            ));
        }
    }
    Ok(())
}

pub(super) fn sync_bn() -> std::result::Result<(), String> {
    let x = global_batch(1, &[8, 3, 4, 4])
        .mul(&Tensor::scalar(2.0f32))
        .map_err(e)?
        .add(&Tensor::scalar(0.5f32))
        .map_err(e)?;
    let wgt = global_batch(2, &[8, 3, 4, 4]);
    // reference: BatchNorm on the whole batch, in this process
    let bn = BatchNorm::new_2d(3);
    let xr = x.detach().requires_grad_(true);
    let yr = bn.forward(&xr).map_err(e)?;
    yr.mul(&wgt)
        .map_err(e)?
        .sum(None, false)
        .map_err(e)?
        .backward()
        .map_err(e)?;
    // SyncBatchNorm on this rank's half; its loss is this half's part of the sum
    let sbn = SyncBatchNorm::new_2d(3);
    let xs = rows(&x).detach().requires_grad_(true);
    let ys = sbn.forward(&xs).map_err(e)?;
    ys.mul(&rows(&wgt))
        .map_err(e)?
        .sum(None, false)
        .map_err(e)?
        .backward()
        .map_err(e)?;
    close("output", &ys.to_f64_vec(), &rows(&yr).to_f64_vec(), 1e-5)?;
    close(
        "input grad",
        &xs.grad().ok_or("no x grad")?.to_f64_vec(),
        &rows(&xr.grad().unwrap()).to_f64_vec(),
        1e-5,
    )?;
    let (w, b) = (
        sbn.inner.weight.as_ref().unwrap(),
        sbn.inner.bias.as_ref().unwrap(),
    );
    for (name, p, pr) in [
        ("weight grad", w, bn.weight.as_ref().unwrap()),
        ("bias grad", b, bn.bias.as_ref().unwrap()),
    ] {
        // the replicas' parameter gradients add up (DDP averages them, with a mean loss)
        let g = p.grad().ok_or("no param grad")?.copy().map_err(e)?;
        dist::all_reduce(&g, ReduceOp::Sum).map_err(e)?;
        close(
            name,
            &g.to_f64_vec(),
            &pr.grad().unwrap().to_f64_vec(),
            1e-5,
        )?;
    }
    for (name, s, r) in [
        ("running_mean", &sbn.inner.running_mean, &bn.running_mean),
        ("running_var", &sbn.inner.running_var, &bn.running_var),
        (
            "num_batches_tracked",
            &sbn.inner.num_batches_tracked,
            &bn.num_batches_tracked,
        ),
    ] {
        close(
            name,
            &s.as_ref().unwrap().to_f64_vec(),
            &r.as_ref().unwrap().to_f64_vec(),
            1e-6,
        )?;
    }
    // eval mode: the running stats, no communication
    sbn.eval();
    bn.eval();
    let ye = sbn.forward(&rows(&x)).map_err(e)?;
    close(
        "eval output",
        &ye.to_f64_vec(),
        &rows(&bn.forward(&x).map_err(e)?).to_f64_vec(),
        1e-5,
    )
}
