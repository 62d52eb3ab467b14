use std::time::Instant;
use burn::tensor::{Device, Tensor, Distribution};
use burnlens::load_model;
use burnlens::model::KvCache;
fn main() {
    let device = Device::flex();
    let m = load_model("target/bench/gpt2-small".as_ref(), &device).unwrap().model;
    let prompt: Vec<i64> = (0..16).map(|i| (i * 997 % 50257) as i64).collect();
    for rep in 0..2 {
        let mut cache = KvCache::new();
        let t0 = Instant::now();
        let _ = m.forward_cached(m.ids_tensor(&prompt), &mut cache).into_data();
        let tp = t0.elapsed();
        let t1 = Instant::now();
        for i in 0..64 { let _ = m.forward_cached(m.ids_tensor(&[(i * 31) as i64]), &mut cache).into_data(); }
        let ts = t1.elapsed();
        if rep == 1 { println!("prompt {:.1} ms, per step {:.2} ms", tp.as_secs_f64() * 1e3, ts.as_secs_f64() / 64.0 * 1e3); }
    }
    // unembed alone
    let x = Tensor::<3>::random([1, 1, 768], Distribution::Normal(0.0, 1.0), &device);
    let t = Instant::now();
    for _ in 0..50 { let _ = m.unembed(x.clone()).into_data(); }
    println!("unembed m=1: {:.2} ms", t.elapsed().as_secs_f64() / 50.0 * 1e3);
    let blk = &m.blocks[0];
    let w = blk.mlp.as_ref().unwrap().fc_in.weight.val();
    let t = Instant::now();
    for _ in 0..200 { let _ = burnlens::model::kernels::linear(x.clone(), w.clone(), None).into_data(); }
    println!("fc_in m=1: {:.3} ms (in cache)", t.elapsed().as_secs_f64() / 200.0 * 1e3);
}
