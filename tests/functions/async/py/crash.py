"""Dies: every attempt ends in worker_crashed."""
import os


def handle(ctx, data):
    os._exit(3)
