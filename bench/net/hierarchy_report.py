"""The table of bench/net/hierarchy_table.sh from its raw.jsonl: per layout and spec, ms per call flat, hierarchical
and auto (with the mode auto took), auto's time over the faster fixed mode, and Horovod's allreduce (none).

    python3 bench/net/hierarchy_report.py OUT/raw.jsonl
"""
import json
import sys


def main(path):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    links = [r["learned_links"] for r in rows if "learned_links" in r]
    rows = [r for r in rows if "time_s" in r]
    layouts = list(dict.fromkeys(r["layout"] for r in rows))
    print("| hosts × ranks | spec | flat ms | hierarchical ms | auto ms (took) | auto / faster fixed | Horovod ms (HIERARCHICAL_ALLREDUCE=0 / 1) |")
    print("|---|---|---|---|---|---|---|")
    for layout in layouts:
        mine = [r for r in rows if r["layout"] == layout]
        hvd = {r["mode"]: r["time_s"] for r in mine if r.get("framework") == "horovod"}
        specs = list(dict.fromkeys(r["spec"] for r in mine if r.get("framework") == "gradcomp"))
        for spec in specs:
            by_mode = {}
            for r in mine:
                if r.get("framework") == "gradcomp" and r["spec"] == spec:
                    by_mode[r["mode"]] = r
            if not {"flat", "hierarchical", "auto"} <= set(by_mode):
                continue
            flat, hier, auto = (by_mode[m]["time_s"] * 1e3 for m in ("flat", "hierarchical", "auto"))
            took = "hier" if by_mode["auto"]["algorithm"].endswith("+hier") else \
                "flat" if by_mode["auto"]["algorithm"].endswith("+flat") else "baseline"
            horovod = ""
            if spec == "none" and hvd:
                horovod = " / ".join(f"{hvd[k] * 1e3:.0f}" for k in ("horovod-hier=0", "horovod-hier=1") if k in hvd)
            print(f"| {layout.replace('x', '×')} | {spec} | {flat:.0f} | {hier:.0f} | {auto:.0f} ({took}) | "
                  f"{auto / min(flat, hier):.2f} | {horovod} |")
    for ls in links:
        print(f"\nlearned links: {json.dumps(ls)}")


if __name__ == "__main__":
    main(sys.argv[1])
