//! `cargo bench`: the same workloads as `kiln bench`, printed as a table.
//! (A plain harness: the figures that matter are ratios within one run.)

fn main() {
    let only: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a.starts_with('W'))
        .collect();
    match kiln::bench::run(&only, 20) {
        Ok(rows) => print!("{}", kiln::bench::table(&rows)),
        Err(e) => {
            eprintln!("bench failed: {e}");
            std::process::exit(1);
        }
    }
}
