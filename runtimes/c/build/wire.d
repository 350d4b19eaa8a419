build/wire.o: src/wire.c src/wire.h
src/wire.h:
