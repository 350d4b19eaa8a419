build/bench_engine: tests/bench_engine.c src/wire.h
src/wire.h:
