build/test_wire: tests/test_wire.c src/wire.h
src/wire.h:
