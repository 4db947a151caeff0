"""A ServerApp of one's own: the fedsuite method the run config names, in Flower's own loop."""

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedsuite.server_app import method_strategy

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    # the method (a Flower Strategy) and w^0, once num_clients SuperNodes have said their partition
    strategy, initial = method_strategy(grid, context)
    result = strategy.start(
        grid=grid,
        initial_arrays=initial,
        num_rounds=int(context.run_config["rounds"]),
        evaluate_fn=strategy.central_evaluation,  # test accuracy and loss after every round
    )
    # the final model: result.arrays; the test accuracy by round: result.evaluate_metrics_serverapp
    best = max(result.evaluate_metrics_serverapp.items(), key=lambda item: item[1]["accuracy"])
    print(f"best test accuracy {best[1]['accuracy']:.4f} after round {best[0]}")
