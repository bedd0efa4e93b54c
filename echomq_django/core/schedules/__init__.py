"""The top layer of core: schedules, their tick arithmetic and the Beat scheduler that fires them."""
