"""Serve the deployments: the pipeline flow and one per stage group, so a user can click Run
in the Prefect UI (or `prefect deployment run 'little-dragon-pipeline/pipeline'`).

    python -m flows.serve          (`make ui` also starts a local Prefect server first)
"""

from __future__ import annotations

from prefect import serve

from flows.pipeline import data_flow, evaluate_flow, pipeline_flow, search_flow, train_flow

DEPLOYMENTS = {"pipeline": pipeline_flow, "search": search_flow, "data": data_flow, "train": train_flow,
               "evaluate-and-register": evaluate_flow}


def main() -> None:
    serve(*[f.to_deployment(name=name, description=f.description, tags=["little-dragon"])
            for name, f in DEPLOYMENTS.items()], limit=1)


if __name__ == "__main__":
    main()
