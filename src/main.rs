//! The `kiln` command-line program.

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "kiln",
    about = "kiln: a PyTorch-style deep-learning engine with a JIT",
    version
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Time the benchmark workloads (W1-W4 eager and compiled, W5-W6 training
    /// steps eager and compiled, W7, W8 copy bandwidth; --only CNN,MLP for the
    /// digits models; --device cuda for W1-W4 and W7 on a GPU).
    Bench {
        /// One JSON object per line instead of a table.
        #[arg(long)]
        json: bool,
        /// Comma-separated workloads to run, e.g. W1,W7 or W5,W6 (default: W1-W8);
        /// W8-64MiB for W1's copy floor alone; also CNN, MLP (inference) and
        /// CNN-compile, MLP-compile (compile latency).
        #[arg(long, value_delimiter = ',')]
        only: Vec<String>,
        /// A digits model (cnn or mlp): its inference eager and compiled, and
        /// its compile latency cold and warm (same as --only CNN,CNN-compile).
        #[arg(long)]
        model: Option<String>,
        /// eager, compiled, or both (compiled rows report compile_ms separately).
        #[arg(long, value_enum, default_value = "both")]
        mode: kiln::bench::Mode,
        /// Timed samples per workload (the median is reported); a sample is
        /// as many back-to-back calls as fill 50 ms.
        #[arg(long, default_value_t = 20)]
        iters: usize,
        /// Profile each workload into a Chrome trace DIR/W1.json, ... (Perfetto, chrome://tracing).
        #[arg(long, value_name = "DIR")]
        profile: Option<std::path::PathBuf>,
        /// cpu, cuda or cuda:N: time W1-W4 and W7 with inputs and weights on
        /// that device (W5/W6 training and W8 stay CPU-only). KILN_CUDA=emulator
        /// runs a CUDA device on the CPU emulator.
        #[arg(long, default_value = "cpu")]
        device: String,
        /// Tiny sizes for W1-W4 and W7 (a smoke test of the path, e.g. on the emulator).
        #[arg(long)]
        quick: bool,
        /// Load-test `kiln serve` on loopback instead: the digits CNN at 1, 8
        /// and 64 concurrent clients, dynamic batching off and on.
        #[arg(long)]
        serve: bool,
        /// With --serve: requests per configuration.
        #[arg(long, default_value_t = 2000)]
        serve_requests: usize,
        /// With --serve: time cap per configuration, in seconds.
        #[arg(long, default_value_t = 15.0)]
        serve_seconds: f64,
    },
    /// Print a compile stage of a model or workload (the text snapshot tests pin).
    Dump {
        /// cnn, mlp, W1, W2, W3 or W4.
        #[arg(long)]
        model: String,
        /// graph, rewritten, fused, backward, kernels, clif, cuda (the CUDA C of each kernel), or explain (the compile report).
        #[arg(long, default_value = "fused")]
        stage: String,
        /// The training step of cnn or mlp: the joint graph (`graph`), the
        /// forward (`fused`) and backward (`backward`) halves.
        #[arg(long)]
        train: bool,
    },
    /// Train a CNN or MLP on the shipped digits (8x8, 10 classes); the last
    /// line printed is `test accuracy: 0.xxxx`.
    Train(kiln::train::TrainArgs),
    /// Export a digits model (cnn or mlp) as a self-contained `.kiln` file or as `.onnx`.
    Export(kiln::deploy::ExportArgs),
    /// Run a `.kiln` or `.onnx` model on tensors from `.npy`, `.pb` or `.safetensors` files.
    Run(kiln::deploy::RunArgs),
    /// Serve the models of a repository over HTTP/JSON (KServe v2 / Open
    /// Inference Protocol): DIR/<model>/<version>/ folders.
    Serve {
        #[arg(long, value_name = "DIR")]
        model_repo: std::path::PathBuf,
        #[arg(long, default_value = "127.0.0.1:8000")]
        addr: std::net::SocketAddr,
    },
    /// Check the installation: versions, CPU ISA and code paths, caches,
    /// CUDA driver/NVRTC/devices, a real matmul and a fused kernel per
    /// backend; ends with one verdict line per backend.
    Doctor {
        /// Exit non-zero unless this backend (cpu or cuda) is usable; repeatable.
        #[arg(long, value_name = "BACKEND")]
        require: Vec<String>,
    },
    /// Draw a log folder's curves (loss, lr, grad norm on shared steps;
    /// accuracies per epoch) as an SVG.
    Plot {
        /// The folder `kiln train --logdir` wrote.
        logdir: std::path::PathBuf,
        /// The SVG to write.
        #[arg(short, long, default_value = "curves.svg")]
        output: std::path::PathBuf,
    },
}

fn main() {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Bench {
            serve: true,
            json,
            serve_requests,
            serve_seconds,
            ..
        } => {
            let load = kiln::bench::serve::ServeLoad {
                requests: serve_requests.max(1),
                time_cap: std::time::Duration::from_secs_f64(serve_seconds.max(0.1)),
            };
            match kiln::bench::serve::serve_rows(load) {
                Ok(rows) if json => rows.iter().for_each(|r| println!("{}", r.json())),
                Ok(rows) => print!("{}", kiln::bench::serve::serve_report(&rows)),
                Err(e) => {
                    eprintln!("kiln bench --serve: {e}");
                    std::process::exit(1);
                }
            }
        }
        Cmd::Bench {
            json,
            mut only,
            model,
            iters,
            mode,
            profile,
            device,
            quick,
            ..
        } if quick || !device.trim().eq_ignore_ascii_case("cpu") => {
            if model.is_some() {
                only.extend(model);
            }
            let run = kiln::bench::parse_device(&device).and_then(|d| {
                let size = kiln::bench::Size::quick(quick);
                kiln::bench::run_on(&only, iters.max(1), mode, size, d, profile.as_deref())
            });
            match run {
                Ok(b) if json => {
                    b.rows.iter().for_each(|r| println!("{}", r.json()));
                    b.skipped.iter().for_each(|k| eprintln!("skipped {k}"));
                }
                Ok(b) => print!("{}", b.report()),
                Err(e) => {
                    eprintln!("kiln bench: {e}");
                    std::process::exit(1);
                }
            }
        }
        Cmd::Bench {
            json,
            mut only,
            model,
            iters,
            mode,
            profile,
            ..
        } => match {
            if let Some(m) = model {
                let m = m.to_ascii_uppercase();
                only.extend([m.clone(), format!("{m}-compile")]);
            }
            kiln::bench::run_profiled(&only, iters.max(1), mode, profile.as_deref())
        } {
            Ok(rows) if json => rows.iter().for_each(|r| println!("{}", r.json())),
            Ok(rows) => print!("{}", kiln::bench::table(&rows)),
            Err(e) => {
                eprintln!("kiln bench: {e}");
                std::process::exit(1);
            }
        },
        Cmd::Dump {
            model,
            stage,
            train,
        } => match if train {
            kiln::bench::dump_train(&model, &stage)
        } else {
            kiln::bench::dump(&model, &stage)
        } {
            Ok(text) => print!("{text}"),
            Err(e) => {
                eprintln!("kiln dump: {e}");
                std::process::exit(1);
            }
        },
        Cmd::Serve { model_repo, addr } => {
            if let Err(e) = kiln::serve::cli(&model_repo, addr) {
                eprintln!("kiln serve: {e}");
                std::process::exit(1);
            }
        }
        Cmd::Doctor { require } => {
            let r = kiln::doctor::run();
            print!("{}", r.text);
            for b in &require {
                match r.verdict(b) {
                    Some(v) if v.is_ok() => {}
                    Some(v) => {
                        eprintln!("kiln doctor: --require {b}: {b} is {}", v.line());
                        std::process::exit(1);
                    }
                    None => {
                        eprintln!("kiln doctor: --require {b}: unknown backend (cpu or cuda)");
                        std::process::exit(2);
                    }
                }
            }
        }
        Cmd::Plot { logdir, output } => match kiln::plot::plot(&logdir, &output) {
            Ok(tags) => println!("wrote {} ({})", output.display(), tags.join(", ")),
            Err(e) => {
                eprintln!("kiln plot: {e}");
                std::process::exit(1);
            }
        },
        Cmd::Train(args) => {
            if let Err(e) = kiln::train::cli(args) {
                eprintln!("kiln train: {e}");
                std::process::exit(1);
            }
        }
        Cmd::Export(args) => match kiln::deploy::export_cli(&args) {
            Ok(line) => println!("{line}"),
            Err(e) => {
                eprintln!("kiln export: {e}");
                std::process::exit(1);
            }
        },
        Cmd::Run(args) => match kiln::deploy::run_cli(&args) {
            Ok(lines) => println!("{lines}"),
            Err(e) => {
                eprintln!("kiln run: {e}");
                std::process::exit(1);
            }
        },
    }
}
