"""A pipeline over MPI (run by tests/distributed/test_pipeline.py::test_mpi_pipeline_three_ranks):

    mpirun --allow-run-as-root --oversubscribe -np 3 .venv/bin/python tests/distributed/pipeline_mpi_check.py

Every rank builds only its block of stories260K (../shared/models/stories260K/hf beside the repo,
or the directory given as argv[1]) as a PipelineDecodeStage and then a PipelineStage, runs the
greedy generation with the others over MpiTransport, and checks that the ids equal the
single-process Generator's (KV-cached and recompute, and four requests micro-batched). It prints one line
"OK rank R world W ids <comma-separated ids>" and exits 0; any failure raises (non-zero exit;
mpirun ends the job).
"""

import sys
from pathlib import Path

import rlx
from rlx.distributed import MpiTransport, PipelineCoordinator, ProcessGroup

N_NEW = 64
PROMPT = [1, 403, 407, 261, 378]  # "Once upon a time" with stories260K's tokenizer


def main() -> None:
    model_dir = Path(sys.argv[1]) if len(sys.argv) > 1 else \
        Path(__file__).resolve().parents[2].parent / "shared" / "models" / "stories260K" / "hf"
    rlx.set_num_threads(1)  # several ranks share the cores
    cfg = rlx.load_config(model_dir)
    weights = rlx.load_weights(model_dir)

    # The single-process oracle, on every rank.
    gen = rlx.Generator(cfg, weights)
    gen.prefill(PROMPT)
    want_cached = gen.generate_cached(N_NEW)
    gen.prefill(PROMPT)
    want_recompute = gen.generate(N_NEW)

    with MpiTransport(timeout=30) as t:
        rank, world = t.rank, t.world
        assert t.name == "mpi" and world >= 2, (t.name, world)
        co = PipelineCoordinator(ProcessGroup(t))

        stage = rlx.PipelineDecodeStage(cfg, "cpu", rank, world, weights)
        assert stage.layers() == rlx.distributed.pipeline_layer_range(cfg.num_hidden_layers, rank, world)
        ids = co.generate(stage, PROMPT, N_NEW, sample_fn=lambda logits: stage.sample(logits))
        assert ids == want_cached, (rank, ids, want_cached)

        rstage = rlx.PipelineStage(cfg, "cpu", rank, world, weights)
        ids_r = co.generate(rstage, PROMPT, 8, sample_fn=lambda logits: rstage.sample(logits))
        assert ids_r == want_recompute[:8], (rank, ids_r, want_recompute[:8])

        # micro-batched: 4 requests in flight through the ranks, each its own monolithic tokens
        prompts = [PROMPT, PROMPT[:2], PROMPT[1:], [1, 403]]
        wants = []
        for p in prompts:
            gen.prefill(p)
            wants.append(gen.generate_cached(12))
        many = co.generate_many(stage, prompts, 12, lambda logits, j: stage.sample(logits))
        assert many == wants, (rank, many, wants)

        co.barrier()
        assert co.timings["steps"] == N_NEW + 8 + 4 * 12, co.timings
        print(f"OK rank {rank} world {world} ids {','.join(map(str, ids))}", flush=True)


if __name__ == "__main__":
    main()
