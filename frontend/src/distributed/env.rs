//! What the launcher told this process: its rank, the world size, its rank
//! on this host, and where rank 0 listens — from mpirun's variables
//! (OpenMPI `OMPI_COMM_WORLD_*`, MPICH/Hydra `PMI_*`) or torchrun's (`RANK`,
//! `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`).

use kiln_ir::{Error, Result};

/// The launcher's view of this process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchEnv {
    pub rank: usize,
    pub world_size: usize,
    pub local_rank: usize,
    /// Where rank 0 listens for the rendezvous (NCCL's unique id).
    pub master_addr: String,
    pub master_port: u16,
    /// `mpirun (OpenMPI)`, `mpirun (MPICH)`, `torchrun` or `none`.
    pub launcher: &'static str,
}

fn var(get: &dyn Fn(&str) -> Option<String>, name: &str) -> Result<Option<usize>> {
    match get(name) {
        None => Ok(None),
        Some(v) => v.trim().parse().map(Some).map_err(|_| {
            Error::op(
                "init_process_group",
                format!("environment variable {name}={v:?} is not a non-negative integer"),
            )
        }),
    }
}

impl LaunchEnv {
    /// Reads the process environment.
    pub fn from_env() -> Result<LaunchEnv> {
        LaunchEnv::from_lookup(&|k| std::env::var(k).ok())
    }

    /// Reads through `get` (tests pass a map). A process started by no
    /// launcher is rank 0 of 1.
    ///
    /// ```
    /// use kiln_frontend::distributed::LaunchEnv;
    /// let env = [("RANK", "1"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "1"), ("MASTER_PORT", "29501")];
    /// let e = LaunchEnv::from_lookup(&|k| env.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())).unwrap();
    /// assert_eq!((e.rank, e.world_size, e.local_rank, e.master_port), (1, 2, 1, 29501));
    /// assert_eq!(e.launcher, "torchrun");
    /// ```
    pub fn from_lookup(get: &dyn Fn(&str) -> Option<String>) -> Result<LaunchEnv> {
        let sets: [(&'static str, [&str; 3]); 3] = [
            (
                "mpirun (OpenMPI)",
                [
                    "OMPI_COMM_WORLD_RANK",
                    "OMPI_COMM_WORLD_SIZE",
                    "OMPI_COMM_WORLD_LOCAL_RANK",
                ],
            ),
            (
                "mpirun (MPICH)",
                ["PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"],
            ),
            ("torchrun", ["RANK", "WORLD_SIZE", "LOCAL_RANK"]),
        ];
        let mut found = None;
        for (launcher, [r, w, l]) in sets {
            if let (Some(rank), Some(world)) = (var(get, r)?, var(get, w)?) {
                let local = var(get, l)?.unwrap_or(rank);
                found = Some((launcher, rank, world, local));
                break;
            }
        }
        let (launcher, rank, world_size, local_rank) = found.unwrap_or(("none", 0, 1, 0));
        if world_size == 0 || rank >= world_size {
            return Err(Error::op(
                "init_process_group",
                format!("{launcher} set rank {rank} but world size {world_size}"),
            ));
        }
        let master_port = match get("MASTER_PORT") {
            None => 29500,
            Some(p) => p.trim().parse().map_err(|_| {
                Error::op(
                    "init_process_group",
                    format!("environment variable MASTER_PORT={p:?} is not a port number"),
                )
            })?,
        };
        Ok(LaunchEnv {
            rank,
            world_size,
            local_rank,
            master_addr: get("MASTER_ADDR").unwrap_or_else(|| "127.0.0.1".into()),
            master_port,
            launcher,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup(pairs: &[(&str, &str)]) -> Result<LaunchEnv> {
        let owned: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        LaunchEnv::from_lookup(&move |k| owned.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
    }

    #[test]
    fn launchers_and_bad_values() {
        let e = lookup(&[
            ("OMPI_COMM_WORLD_RANK", "3"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("RANK", "0"),
        ])
        .unwrap();
        assert_eq!((e.rank, e.world_size, e.local_rank), (3, 4, 1));
        assert_eq!(e.launcher, "mpirun (OpenMPI)");
        let e = lookup(&[]).unwrap();
        assert_eq!((e.rank, e.world_size, e.launcher), (0, 1, "none"));
        assert_eq!(
            (e.master_addr.as_str(), e.master_port),
            ("127.0.0.1", 29500)
        );
        let err = lookup(&[("RANK", "x"), ("WORLD_SIZE", "2")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("RANK=\"x\""), "{err}");
        let err = lookup(&[("RANK", "2"), ("WORLD_SIZE", "2")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("rank 2 but world size 2"), "{err}");
    }
}
