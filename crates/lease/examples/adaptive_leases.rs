//! One client reads one object through leases on virtual time; the server's tuner adapts the
//! lease duration as the object goes from cold to hot (in NVM) and is then promoted to DRAM.
//!
//! Run with `cargo run -p dmkit-lease --example adaptive_leases`.

use std::time::Duration;

use dmkit_lease::{Clock, LeaseConfig, LeaseTable, LeaseTuner, Tier, TunerConfig, VirtualClock};

const OBJ: u64 = 7;
const CLIENT: u64 = 1;

fn main() -> Result<(), dmkit_lease::LeaseError> {
    let clock = VirtualClock::new();
    let table = LeaseTable::new(clock.clone(), LeaseConfig::default());
    let config = TunerConfig::default();
    let tuner = LeaseTuner::new(config)?;

    let phases = [
        ("cold, NVM", Duration::from_millis(250), Tier::Nvm),
        ("hot, NVM", Duration::from_micros(10), Tier::Nvm),
        ("hot, DRAM", Duration::from_micros(10), Tier::Dram),
    ];
    println!(
        "{:<10} {:>6} {:>12} {:>10}",
        "phase", "window", "lease", "re-grants"
    );
    for (name, gap, tier) in phases {
        tuner.set_tier(OBJ, tier);
        for window in 0..12 {
            let end = clock.now().saturating_add(config.window);
            let (mut accesses, mut grants) = (0, 0);
            while clock.now() < end {
                // The client uses its lease if the holder's view says it may; otherwise it
                // pays a round trip for a new one.
                if !table.is_valid_for_holder(CLIENT, OBJ, clock.now()) {
                    table.grant(CLIENT, OBJ, tuner.duration_for(OBJ))?;
                    grants += 1;
                }
                accesses += 1;
                clock.advance(gap);
            }
            tuner.record_accesses(OBJ, accesses);
            tuner.record_grants(OBJ, grants);
            tuner.end_window();
            if window % 3 == 2 {
                println!(
                    "{name:<10} {window:>6} {:>12?} {grants:>10}",
                    tuner.duration_for(OBJ)
                );
            }
        }
    }
    println!("lease table: {:?}", table.stats());
    Ok(())
}
