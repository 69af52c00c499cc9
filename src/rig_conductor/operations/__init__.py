"""What operators do and see, shared by the JSON API and the console: dead letters, moves by
hand, and the read models of the console's views. Each action is recorded in the event log
and in one audit log line naming who did it."""
