/* A library that is not a valid handler: it lacks staccato_handle. */
int not_a_handler(void);
int not_a_handler(void) { return 0; }
