"""Generate the spiral workload once, with a manifest; training only reads it."""

import argparse

from ddpscale.core.spiral import write_dataset


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--samples", type=int, required=True)
    p.add_argument("--noise", type=float, required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--split", type=float, nargs=3, required=True, metavar=("TRAIN", "VAL", "TEST"))
    p.add_argument("--out", required=True, help="the .npz data file")
    p.add_argument("--manifest", required=True, help="manifest.json beside it")
    args = p.parse_args(argv)
    manifest = write_dataset(args.out, args.manifest, args.samples, args.noise, args.seed, args.split)
    print(f"wrote {args.out}: {manifest['samples']} samples, splits {manifest['splits']}, sha256 {manifest['sha256'][:12]}")


if __name__ == "__main__":
    main()
